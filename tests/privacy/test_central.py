"""Known answers for DP-FedAvg's server side: clipping, the noise's scale and seed, adaptive clipping's rule, and
Poisson sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsim.core.seeding import dp_seed
from fedsim.privacy.central import CentralDP
from fedsim.privacy.rounds import PrivateRounds, check_delta
from fedsim.privacy.sampling import poisson_sample


def _mean(
    dp: CentralDP,
    params: list[torch.Tensor],
    *,
    seed: int = 0,
    round_num: int = 1,
    expected: float = 2.0,
    clip: float = 1.0,
):
    return dp.noisy_mean(
        seed, round_num, torch.zeros(params[0].numel()) if params else torch.zeros(2), params, expected, clip
    )


def test_updates_are_clipped_to_the_norm_and_divided_by_the_expected_cohort() -> None:
    dp = CentralDP(noise_multiplier=1e-12, clip_norm=1.0)  # noise far below float32's resolution here
    mean, metrics, next_clip = _mean(dp, [torch.tensor([3.0, 4.0]), torch.tensor([0.3, 0.4])], expected=4.0)
    # [3, 4] has norm 5 → [0.6, 0.8]; [0.3, 0.4] (norm 0.5) is kept; the sum over 4 expected clients
    assert mean.tolist() == pytest.approx([0.225, 0.3], abs=1e-7)
    assert next_clip == 1.0 and metrics["dp/cohort"] == 2 and metrics["dp/clip_norm"] == 1.0


def test_noise_has_std_z_times_c_over_m_and_depends_on_seed_and_round_only() -> None:
    dp = CentralDP(noise_multiplier=2.0, clip_norm=0.5)
    zeros = torch.zeros(200_000)
    mean, _, _ = dp.noisy_mean(7, 3, zeros, [], 4.0, 0.5)
    assert float(mean.mean()) == pytest.approx(0.0, abs=5 * 0.25 / math.sqrt(200_000))
    assert float(mean.std()) == pytest.approx(2.0 * 0.5 / 4.0, rel=0.01)
    assert torch.equal(mean, dp.noisy_mean(7, 3, zeros, [], 4.0, 0.5)[0])
    assert not torch.equal(mean, dp.noisy_mean(7, 4, zeros, [], 4.0, 0.5)[0])
    assert not torch.equal(mean, dp.noisy_mean(8, 3, zeros, [], 4.0, 0.5)[0])


def test_adaptive_clipping_moves_the_norm_geometrically_toward_the_target_quantile() -> None:
    dp = CentralDP(
        noise_multiplier=1.0, clip_norm=1.0, adaptive=True, target_quantile=0.5, clip_lr=0.2, count_noise=0.8
    )
    # expected 4, three of four updates within the clip norm: b̃ = (3 − 4/2 + 0.8·n)/4 + 1/2, n the round's first
    # standard normal draw from the generator seeded by (seed, round)
    n = float(torch.randn((), generator=torch.Generator().manual_seed(dp_seed(0, 1)), dtype=torch.float64))
    updates = [torch.tensor([0.1, 0.0]), torch.tensor([0.0, 0.2]), torch.tensor([0.5, 0.5]), torch.tensor([3.0, 0.0])]
    _, metrics, next_clip = _mean(dp, updates, expected=4.0)
    estimate = (1 + 0.8 * n) / 4 + 0.5
    assert metrics["dp/unclipped_estimate"] == pytest.approx(estimate, rel=1e-12)
    assert next_clip == pytest.approx(math.exp(-0.2 * (estimate - 0.5)), rel=1e-12)


def test_adaptive_clipping_raises_the_update_noise_so_the_total_is_z() -> None:
    dp = CentralDP(noise_multiplier=1.0, clip_norm=1.0, adaptive=True, count_noise=1.0)
    z_update = dp.update_multiplier(10.0)
    assert z_update == pytest.approx((1 - 1 / 4) ** -0.5)
    assert (z_update**-2 + (2 * 1.0) ** -2) ** -0.5 == pytest.approx(1.0)  # the two releases compose to z
    with pytest.raises(ValueError, match=r"dp.count_noise=0.5 is too small for noise_multiplier=2.0.*e.g. 2$"):
        CentralDP(noise_multiplier=2.0, clip_norm=1.0, adaptive=True, count_noise=0.5).update_multiplier(10.0)


def test_poisson_sampling_takes_each_client_with_the_rate_independently() -> None:
    counts = np.zeros(50)
    sizes = []
    for round_num in range(4000):
        picked = poisson_sample(np.random.default_rng([1, round_num]), 50, 0.1)
        counts[picked] += 1
        sizes.append(len(picked))
    assert np.all(np.abs(counts / 4000 - 0.1) < 5 * math.sqrt(0.1 * 0.9 / 4000))
    assert np.var(sizes) == pytest.approx(50 * 0.1 * 0.9, rel=0.1)  # binomial, not a fixed size
    assert 0 in sizes or min(sizes) <= 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"noise_multiplier": 0.0, "clip_norm": 1.0}, "dp.noise_multiplier must be a finite number > 0"),
        ({"noise_multiplier": 1.0, "clip_norm": -1.0}, "dp.clip_norm must be a finite number > 0"),
        ({"noise_multiplier": 1.0, "clip_norm": 1.0, "delta": 1.0}, "dp.delta must be in (0, 1)"),
        ({"noise_multiplier": 1.0, "clip_norm": 1.0, "epsilon_max": 0}, "dp.epsilon_max must be > 0 or null"),
        ({"noise_multiplier": math.inf, "clip_norm": 1.0}, "dp.noise_multiplier must be a finite number > 0"),
        ({"noise_multiplier": 1.0, "clip_norm": 1.0, "adaptive": "no"}, "dp.adaptive must be true or false"),
        ({"noise_multiplier": 1.0, "clip_norm": 1.0, "clip_lr": -1}, "dp.clip_lr must be a finite number > 0 (got -1)"),
        (
            {"noise_multiplier": 1.0, "clip_norm": 1.0, "count_noise": 0.0},
            "dp.count_noise must be a finite number > 0 or null",
        ),
        ({"noise_multiplier": 1.0, "clip_norm": 1.0, "accountant": "moments"}, "dp.accountant must be one of rdp, pld"),
    ],
)
def test_bad_settings_are_refused_in_one_line(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        CentralDP(**kwargs)


def test_delta_must_be_far_below_one_over_the_number_of_clients(caplog: pytest.LogCaptureFixture) -> None:
    # 50 clients: 1/n = 0.02 is refused, [1/(10n), 1/n) = [0.002, 0.02) runs with a warning, below that silently
    dp = CentralDP(noise_multiplier=1.0, clip_norm=1.0, delta=0.02)
    with pytest.raises(ValueError, match=r"^dp.delta=0.02 must be below 1/50 = 0.02, one over the run's 50 clients"):
        PrivateRounds(dp, num_clients=50, clients_per_round=5, seed=0)
    with caplog.at_level("WARNING", logger="fedsim"):
        check_delta(0.002, 50)
        check_delta(0.0019, 50)
    assert [r.getMessage().split(" is close")[0] for r in caplog.records] == ["dp.delta=0.002"]
    assert "1/50" in caplog.records[0].getMessage() and "\n" not in caplog.records[0].getMessage()


def test_the_clients_weights_are_left_as_they_were_even_in_float64() -> None:
    weights = torch.ones(4, dtype=torch.float64)
    CentralDP(noise_multiplier=1.0, clip_norm=1.0).noisy_mean(
        0, 1, torch.full((4,), 0.25, dtype=torch.float64), [weights], 1.0, 1.0
    )
    assert weights.tolist() == [1.0] * 4
