"""Distributed DP in the ``secagg`` stage (fedsim/secagg/ddp.py, stages.py) on hand-made round records: the noise goes
in before the masks and comes out in the decoded mean, conditional rounding keeps every client within Δ₂, the ε the
stage reports is the papers' formula with the round's ℓ, σ, m and d' worked out here, fewer survivors cost more,
the budget stops the run before it is exceeded, and bad settings are one line."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from fedsim.core.errors import RoundFailedError
from fedsim.core.types import ClientUpdate
from fedsim.secagg import DistributedDP, SecureAggregation
from fedsim.secagg.accounting import ddg_rdp, rdp_epsilon, rounded_l2_bound, skellam_rdp
from fedsim.secagg.ddp import NOISE_SIGMAS
from fedsim.secagg.quantize import Quantizer, rotation_signs, unrotate
from fedsim.server import RoundRecord


def _record(round_num: int, ids: list[int], size: int = 5) -> RoundRecord:
    generator = torch.Generator().manual_seed(round_num)
    start = torch.randn(size, generator=generator)
    record = RoundRecord(round_num, start, 0.0, start, configs={c: {} for c in ids})
    record.kept = [
        ClientUpdate(c, round_num, start + 0.1 * torch.randn(size, generator=generator), num_examples=10) for c in ids
    ]
    return record


def _stage(mechanism: str = "ddg", **kwargs: Any) -> SecureAggregation:
    settings: dict[str, Any] = {"noise_multiplier": 1.0} | kwargs.pop("dp", {})
    return SecureAggregation(seed=4, bits=16, clip=0.2, dp=DistributedDP(mechanism=mechanism, **settings), **kwargs)


@pytest.mark.parametrize("mechanism", ["ddg", "skellam"])
def test_the_noise_is_added_before_masking_and_decoded_with_the_mean(mechanism: str) -> None:
    """The decoded mean = the clipped mean + Rᵀ(Σ noise)/(s·m), within the quantization's bound (the stage's own
    error_max is measured without the noise and stays within it)."""
    ids = [0, 1, 2, 3]
    stage, record = _stage(mechanism), _record(1, ids)
    metrics = stage.run(record)
    noise = stage.round_noise
    assert noise is not None and metrics["dp/noise_clients"] == 4 and metrics["wrapped"] == 0
    total = sum(noise.sample(4, 1, c) for c in ids)
    assert isinstance(total, torch.Tensor)
    scale = metrics["scale"]
    shift = unrotate(total.double() / scale, rotation_signs(4, 1, 8), 5) / 4
    deltas = [u.params.double() - record.params.double() for u in record.kept]
    clipped = torch.stack([d * min(1.0, 0.2 / float(d.norm())) for d in deltas]).mean(0)
    [aggregate] = record.aggregate_input or []
    mean = aggregate.params.double() - record.params.double()
    bound = metrics["error_bound"] + 2**-24 * float(aggregate.params.abs().max() + 1)  # and the float32 weights
    assert float((mean - clipped - shift).abs().max()) <= bound
    assert float(shift.abs().max()) > 10 * metrics["error_bound"]  # the noise is there, far above the rounding
    assert metrics["error_max"] <= metrics["error_bound"]


def test_conditional_rounding_keeps_every_client_within_the_bound() -> None:
    """ℓ = 16 in d' = 1024 coordinates, each 0.5 (norm 16): unconditional rounding gives ‖q‖² = Σ qᵢ, qᵢ ∈ {0, 1}
    at 1/2 each, of mean 512 and standard deviation 16; with β = 0.9 the bound is Δ₂² = 256 + 256 + √(2 ln(10/9))·32
    ≈ 526.7, which a fifth of the draws exceed. Conditional rounding never does, and equals the unconditional draw
    whenever that one is within the bound (the same generator)."""
    quantizer = Quantizer(16, 16.0, 1.0, 16.0, None)
    x = torch.full((1024,), 0.5, dtype=torch.float64)
    bound = rounded_l2_bound(16.0, 1024, 0.9)
    assert bound**2 == pytest.approx(512 + math.sqrt(2 * math.log(1 / 0.9)) * 32, rel=1e-14)
    exceeded = 0
    for seed in range(40):
        plain = quantizer.quantize(x, torch.Generator().manual_seed(seed))
        conditional = quantizer.quantize(x, torch.Generator().manual_seed(seed), bound)
        assert float(conditional.double().square().sum()) <= bound**2
        inside = float(plain.double().square().sum()) <= bound**2
        exceeded += not inside
        assert torch.equal(plain, conditional) == inside
    assert exceeded > 0


@pytest.mark.parametrize("mechanism", ["ddg", "skellam"])
def test_epsilon_per_round_is_the_papers_formula_with_this_round_s_parameters(mechanism: str) -> None:
    """b = 16, 4 clients, K = 4, z = 1, d' = 8: ℓ = ⌊(2^15 − 2)/(4 + 6·1·√(4/4))⌋ = 3276, σ = z·ℓ/√K = 1638,
    Δ₂ = √(ℓ² + 8/4 + (ℓ + √8/2)) (β = e^(−1/2)), Δ₁ = Δ₂·√8; after r rounds ε = ε(r × the round's curve)."""
    assert NOISE_SIGMAS == 6.0
    levels, sigma = 3276, 3276 / 2
    l2 = math.sqrt(levels**2 + 2 + levels + math.sqrt(8) / 2)
    l1 = l2 * math.sqrt(8)
    curve = ddg_rdp(l2, l1, sigma, 4, 8) if mechanism == "ddg" else skellam_rdp(l2, l1, 4 * sigma**2)
    stage = _stage(mechanism, clients_per_round=4)
    for r in (1, 2, 3):
        metrics = stage.run(_record(r, [0, 1, 2, 3]))
        assert metrics["scale"] == levels / 0.2 and metrics["dp/local_std"] == pytest.approx(sigma, rel=1e-15)
        assert metrics["dp/l2_sensitivity"] == pytest.approx(l2, rel=1e-15)
        assert metrics["dp/epsilon"] == pytest.approx(rdp_epsilon(r * curve, 1e-5), rel=1e-12)
        assert metrics["dp/gamma"] == pytest.approx(0.2 / levels, rel=1e-15)


def test_fewer_survivors_put_less_noise_in_the_sum_and_cost_more_epsilon() -> None:
    full, dropping = _stage(clients_per_round=8), _stage(clients_per_round=8, dropout=0.3)
    ids = list(range(8))
    a, b = full.run(_record(1, ids)), dropping.run(_record(1, ids))
    assert b["survivors"] < 8 and b["dp/noise_clients"] == b["survivors"] and a["dp/noise_clients"] == 8
    noise = dropping.round_noise
    assert noise is not None
    assert b["dp/epsilon"] == pytest.approx(rdp_epsilon(noise.rdp(int(b["survivors"])), 1e-5), rel=1e-12)
    assert b["dp/epsilon"] > a["dp/epsilon"]


def test_the_budget_stops_the_run_before_the_round_that_would_exceed_it() -> None:
    stage = _stage(clients_per_round=4)
    eps = [stage.run(_record(r, [0, 1, 2, 3]))["dp/epsilon"] for r in (1, 2, 3)]
    budget = (eps[1] + eps[2]) / 2  # two rounds fit, the third would not
    capped = _stage(clients_per_round=4, dp={"epsilon_max": budget})
    first, second = _record(1, [0, 1, 2, 3]), _record(2, [0, 1, 2, 3])
    capped.run(first)
    capped.run(second)
    assert first.stop_reason is None
    assert second.stop_reason == (
        f"privacy budget: round 3 would bring ε to {eps[2]:.4g} > secagg.dp.epsilon_max={budget} "
        f"(ε={eps[1]:.4g} after 2 rounds, δ=1e-05)"
    )


def test_a_round_with_fewer_survivors_than_planned_that_exceeds_the_budget_stops_the_run_after_it() -> None:
    """The prediction assumes the K planned clients' noise; a round that lost clients costs more, and may exceed the
    budget: the run then stops right after it, saying so."""
    planned = _stage(clients_per_round=8)
    planned.run(_record(1, list(range(8))))
    budget = planned.dp.epsilon(planned.round_noise.rdp(8) if planned.round_noise else None) * 1.001
    stage = _stage(clients_per_round=8, dp={"epsilon_max": budget})
    stage.run(_record(1, list(range(8))))
    record = _record(2, list(range(8)))
    record.kept = record.kept[:5]  # three clients' updates never arrived
    metrics = stage.run(record)
    assert metrics["dp/epsilon"] > budget and metrics["dp/noise_clients"] == 5
    assert record.stop_reason is not None
    assert record.stop_reason.startswith(f"privacy budget: ε={metrics['dp/epsilon']:.4g} after round 2 exceeds")


def test_a_budget_below_one_round_is_refused_in_one_line_before_any_release() -> None:
    stage = _stage(clients_per_round=4, dp={"epsilon_max": 0.01})
    with pytest.raises(ValueError) as error:
        stage.prepare(5)
    assert str(error.value).startswith("secagg.dp.epsilon_max=0.01 is below ε=") and "\n" not in str(error.value)
    record = _record(1, [0, 1, 2, 3])
    with pytest.raises(RoundFailedError) as failed:
        _stage(clients_per_round=4, dp={"epsilon_max": 0.01}).run(record)
    assert (
        str(failed.value).startswith("round 1: secagg.dp.epsilon_max=0.01 is below") and record.aggregate_input is None
    )


def test_the_same_round_gives_the_same_bits_and_a_client_s_noise_is_its_own() -> None:
    runs = []
    for _ in range(2):
        record = _record(3, [0, 1, 2, 3])
        _stage("skellam", clients_per_round=4).run(record)
        runs.append((record.aggregate_input or [])[0].params)
    assert torch.equal(runs[0], runs[1])
    a, b = _stage(clients_per_round=4), _stage(clients_per_round=4)
    a.run(_record(3, [0, 1, 2, 3]))
    b.run(_record(3, [3, 5, 6, 7]))
    assert a.round_noise is not None and b.round_noise is not None
    assert torch.equal(a.round_noise.sample(4, 3, 3), b.round_noise.sample(4, 3, 3))


def test_a_target_epsilon_is_met_after_num_rounds() -> None:
    stage = _stage(dp={"noise_multiplier": None, "epsilon": 2.0}, clients_per_round=4, num_rounds=3)
    last = [stage.run(_record(r, [0, 1, 2, 3]))["dp/epsilon"] for r in (1, 2, 3)][-1]
    assert last <= 2.0 and last == pytest.approx(2.0, rel=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "line"),
    [
        ({"mechanism": "gauss"}, "secagg.dp.mechanism must be one of none, ddg, skellam (got 'gauss')"),
        ({"mechanism": "ddg"}, "secagg.dp.mechanism=ddg needs exactly one of secagg.dp.noise_multiplier and"),
        ({"mechanism": "ddg", "noise_multiplier": 1.0, "epsilon": 2.0}, "secagg.dp.mechanism=ddg needs exactly one"),
        ({"mechanism": "skellam", "noise_multiplier": 0}, "secagg.dp.noise_multiplier must be > 0 or null (got 0)"),
        ({"mechanism": "ddg", "noise_multiplier": 1.0, "delta": 1.0}, "secagg.dp.delta must be in (0, 1)"),
        ({"mechanism": "ddg", "noise_multiplier": 1.0, "beta": 1.0}, "secagg.dp.beta must be in [0, 1)"),
        ({"mechanism": "ddg", "noise_multiplier": 1.0, "epsilon_max": -1}, "secagg.dp.epsilon_max must be > 0"),
    ],
)
def test_bad_settings_are_one_line_naming_the_key(kwargs: dict[str, Any], line: str) -> None:
    with pytest.raises(ValueError) as error:
        DistributedDP(**kwargs)
    assert str(error.value).startswith(line) and "\n" not in str(error.value)


def test_a_target_without_the_number_of_rounds_is_one_line() -> None:
    with pytest.raises(ValueError) as error:
        SecureAggregation(dp=DistributedDP(mechanism="ddg", epsilon=1.0))
    assert str(error.value) == "secagg.dp.epsilon is a target for the whole run: give the stage num_rounds"


def test_the_papers_scale_fits_k_standard_deviations_of_a_coordinate_of_the_sum() -> None:
    """secagg.scale_sigmas = 4, b = 16, 4 clients (K = 4), z = 1, d' = 8: a coordinate of the sum has variance
    ℓ²·(n²/d' + z²·n/K) + n/4 = ℓ²·(16/8 + 1) + 1, and 4 standard deviations must fit in 2^15 − 1:
    ℓ = ⌊√(((2^15 − 1)/4)² − 1)/√3)⌋."""
    expected = math.floor(math.sqrt(((2**15 - 1) / 4) ** 2 - 1) / math.sqrt(3))
    stage = _stage(clients_per_round=4, scale_sigmas=4.0)
    metrics = stage.run(_record(1, [0, 1, 2, 3]))
    assert metrics["scale"] == expected / 0.2 and metrics["dp/local_std"] == pytest.approx(expected / 2, rel=1e-15)
    assert expected > 3276  # more levels than the scale that rules wrap-around out (3276, above), even at d' = 8
    with pytest.raises(ValueError) as error:
        SecureAggregation(scale_sigmas=0)
    assert str(error.value) == "secagg.scale_sigmas must be > 0 or null (got 0)"
