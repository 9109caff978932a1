"""Server optimizers (FedOpt: FedAvgM, FedAdagrad, FedAdam, FedYogi): hand-computed answers over two rounds,
agreement with torch.optim, properties, checkpoint round-trips, validation and the Hydra configs."""

from __future__ import annotations

import inspect
import io
import math
from collections.abc import Callable, Sequence

import pytest
import torch
from hydra.errors import InstantiationException
from hydra.utils import get_method, instantiate
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsim.cli.run import compose
from fedsim.core.types import ClientUpdate
from fedsim.strategy import FedAdagrad, FedAdam, FedAvg, FedAvgM, FedOpt, FedYogi, Strategy


def _updates(x: torch.Tensor, deltas: Sequence[Sequence[float]], sizes: Sequence[int]) -> list[ClientUpdate]:
    """Clients whose weights are ``x + delta`` (float32), with ``sizes`` examples each."""
    return [
        ClientUpdate(i, 1, (x.double() + torch.tensor(d, dtype=torch.float64)).float(), n)
        for i, (d, n) in enumerate(zip(deltas, sizes, strict=True))
    ]


def _close(got: torch.Tensor, expected: Sequence[float]) -> None:
    torch.testing.assert_close(got.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=1e-6)


# --- known answers, two rounds each (m and v carry over) -------------------------------------------------


def test_fedavgm_known_answer_two_rounds() -> None:
    s = FedAvgM(server_lr=0.5, momentum=0.5)
    x0 = torch.tensor([0.0, 1.0])
    # round 1: clients [2, 3] (n=1) and [4, 1] (n=3): mean (1·[2,3] + 3·[4,1]) / 4 = [3.5, 1.5]
    #   Δ1 = [3.5, 0.5];  m1 = 0.5·0 + Δ1 = [3.5, 0.5];  x1 = x0 + 0.5·m1 = [1.75, 1.25]
    x1 = s.aggregate(
        1, x0, [ClientUpdate(0, 1, torch.tensor([2.0, 3.0]), 1), ClientUpdate(1, 1, torch.tensor([4.0, 1.0]), 3)]
    )
    assert torch.equal(x1, torch.tensor([1.75, 1.25]))
    assert torch.equal(s.m, torch.tensor([3.5, 0.5], dtype=torch.float64)) and s.v is None and s.step == 1
    # round 2: clients [2.75, -0.75] and [4.75, 1.25] (n=2 each): mean [3.75, 0.25], Δ2 = [2, -1]
    #   m2 = 0.5·[3.5, 0.5] + [2, -1] = [3.75, -0.75];  x2 = [1.75, 1.25] + 0.5·m2 = [3.625, 0.875]
    x2 = s.aggregate(
        2, x1, [ClientUpdate(0, 2, torch.tensor([2.75, -0.75]), 2), ClientUpdate(1, 2, torch.tensor([4.75, 1.25]), 2)]
    )
    assert torch.equal(x2, torch.tensor([3.625, 0.875]))
    assert torch.equal(s.m, torch.tensor([3.75, -0.75], dtype=torch.float64)) and s.step == 2


def test_fedadam_known_answer_two_rounds() -> None:
    # η = 12, β1 = 0.5, β2 = 0.5, τ = 1, so v starts at τ² = 1; no bias correction (the paper's rule)
    s = FedAdam(server_lr=12.0, momentum=0.5, beta2=0.5, tau=1.0)
    x0 = torch.zeros(2)
    # round 1: deltas [6, 0] and [8, -2], equal sizes: Δ1 = [7, -1]
    #   m1 = 0.5·Δ1 = [3.5, -0.5];  v1 = 0.5·1 + 0.5·[49, 1] = [25, 1]
    #   x1 = 0 + 12·[3.5 / (5 + 1), -0.5 / (1 + 1)] = [7, -3]
    x1 = s.aggregate(1, x0, _updates(x0, [[6, 0], [8, -2]], [5, 5]))
    _close(x1, [7.0, -3.0])
    _close(s.m, [3.5, -0.5])
    _close(s.v, [25.0, 1.0])
    # round 2: deltas [-4, 8] and [-6, 6], equal sizes: Δ2 = [-5, 7]
    #   m2 = 0.5·[3.5, -0.5] + 0.5·[-5, 7] = [-0.75, 3.25];  v2 = 0.5·[25, 1] + 0.5·[25, 49] = [25, 25]
    #   x2 = [7, -3] + 12·[-0.75 / 6, 3.25 / 6] = [7 - 1.5, -3 + 6.5] = [5.5, 3.5]
    x2 = s.aggregate(2, x1, _updates(x1, [[-4, 8], [-6, 6]], [3, 3]))
    _close(x2, [5.5, 3.5])
    _close(s.m, [-0.75, 3.25])
    _close(s.v, [25.0, 25.0])


def test_fedyogi_known_answer_two_rounds() -> None:
    # η = 1, β1 = 0.5, β2 = 0.5, τ = 1 (v starts at 1)
    s = FedYogi(server_lr=1.0, momentum=0.5, beta2=0.5, tau=1.0)
    x0 = torch.tensor([1.0, -1.0])
    # round 1: Δ1 = [4, 1] (deltas [3, 1] n=1 and [5, 1] n=1)
    #   v1 = 1 - 0.5·Δ²·sign(1 - Δ²) = [1 - 0.5·16·(-1), 1 - 0.5·1·0] = [9, 1]   (sign(0) = 0: v unchanged)
    #   m1 = [2, 0.5];  x1 = [1, -1] + [2 / (3 + 1), 0.5 / (1 + 1)] = [1.5, -0.75]
    x1 = s.aggregate(1, x0, _updates(x0, [[3, 1], [5, 1]], [1, 1]))
    _close(x1, [1.5, -0.75])
    _close(s.v, [9.0, 1.0])
    # round 2: Δ2 = [2, -3] (deltas [2, -3] n=2, [2, -3] n=1)
    #   v2 = [9 - 0.5·4·sign(9 - 4), 1 - 0.5·9·sign(1 - 9)] = [7, 5.5]   (Yogi: v shrinks where v > Δ²)
    #   m2 = 0.5·[2, 0.5] + 0.5·[2, -3] = [2, -1.25];  x2 = x1 + [2 / (√7 + 1), -1.25 / (√5.5 + 1)]
    x2 = s.aggregate(2, x1, _updates(x1, [[2, -3], [2, -3]], [2, 1]))
    _close(s.v, [7.0, 5.5])
    _close(s.m, [2.0, -1.25])
    _close(x2, [1.5 + 2 / (math.sqrt(7) + 1), -0.75 - 1.25 / (math.sqrt(5.5) + 1)])


def test_fedadagrad_known_answer_two_rounds() -> None:
    # η = 1, β1 = 0.5, τ = 1 (v starts at 1)
    s = FedAdagrad(server_lr=1.0, momentum=0.5, tau=1.0)
    x0 = torch.zeros(2)
    # round 1: Δ1 = [3, -1] (deltas [2, -1] n=1 and [3.5, -1] n=2: (2 + 7) / 3 = 3)
    #   v1 = 1 + [9, 1] = [10, 2];  m1 = [1.5, -0.5];  x1 = [1.5 / (√10 + 1), -0.5 / (√2 + 1)]
    x1 = s.aggregate(1, x0, _updates(x0, [[2, -1], [3.5, -1]], [1, 2]))
    expected1 = [1.5 / (math.sqrt(10) + 1), -0.5 / (math.sqrt(2) + 1)]
    _close(x1, expected1)
    _close(s.v, [10.0, 2.0])
    # round 2: Δ2 = [1, 2]:  v2 = [10, 2] + [1, 4] = [11, 6];  m2 = 0.5·[1.5, -0.5] + 0.5·[1, 2] = [1.25, 0.75]
    #   x2 = x1 + [1.25 / (√11 + 1), 0.75 / (√6 + 1)]
    x2 = s.aggregate(2, x1, _updates(x1, [[1, 2], [1, 2], [1, 2]], [1, 4, 2]))
    _close(s.v, [11.0, 6.0])
    _close(s.m, [1.25, 0.75])
    _close(x2, [expected1[0] + 1.25 / (math.sqrt(11) + 1), expected1[1] + 0.75 / (math.sqrt(6) + 1)])


def test_fedadam_with_bias_correction_known_answer_two_rounds() -> None:
    # η = 1, β1 = 0.5, β2 = 0.75, τ = 1; bias correction on, so v starts at 0 (torch.optim.Adam's convention)
    s = FedAdam(server_lr=1.0, momentum=0.5, beta2=0.75, tau=1.0, bias_correction=True)
    assert s.initial_accumulator == 0.0
    x0 = torch.zeros(2)
    # round 1: Δ1 = [3, -1]:  m1 = 0.5·Δ1 = [1.5, -0.5], m̂ = m1 / (1 - 0.5) = [3, -1]
    #   v1 = 0.25·[9, 1] = [2.25, 0.25], v̂ = v1 / (1 - 0.75) = [9, 1];  x1 = [3 / (3 + 1), -1 / (1 + 1)] = [0.75, -0.5]
    x1 = s.aggregate(1, x0, _updates(x0, [[3, -1], [3, -1]], [1, 1]))
    _close(x1, [0.75, -0.5])
    # round 2: Δ2 = [1, 1]:  m2 = 0.5·[1.5, -0.5] + 0.5·[1, 1] = [1.25, 0.25], m̂ = m2 / 0.75 = [5/3, 1/3]
    #   v2 = 0.75·[2.25, 0.25] + 0.25·[1, 1] = [1.9375, 0.4375], v̂ = v2 / (1 - 0.5625) = [31/7, 1]
    #   x2 = [0.75, -0.5] + [(5/3) / (√(31/7) + 1), (1/3) / (1 + 1)]
    x2 = s.aggregate(2, x1, _updates(x1, [[0, 2], [2, 0]], [1, 1]))
    _close(s.m, [1.25, 0.25])
    _close(s.v, [1.9375, 0.4375])
    _close(x2, [0.75 + (5 / 3) / (math.sqrt(31 / 7) + 1), -0.5 + 1 / 6])


def test_the_global_params_and_updates_are_not_modified_and_dtype_is_kept() -> None:
    s = FedAdam()
    x = torch.tensor([1.0, 2.0], dtype=torch.float32)
    updates = _updates(x, [[1, 1], [2, 2]], [1, 1])
    kept_x, kept_u = x.clone(), updates[0].params.clone()
    new = s.aggregate(1, x, updates)
    assert new.dtype == torch.float32 and new.shape == (2,)
    assert torch.equal(x, kept_x) and torch.equal(updates[0].params, kept_u)


# --- agreement with torch.optim (pseudo-gradient g = -Δ) -----------------------------------------------------


def _against_torch(strategy: FedOpt, make_opt: Callable[[list[torch.Tensor]], torch.optim.Optimizer]) -> None:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(6, generator=gen, dtype=torch.float64)
    p = torch.nn.Parameter(x.clone())
    opt = make_opt([p])
    for round_num in range(1, 5):
        updates = [
            ClientUpdate(i, round_num, (x + torch.randn(6, generator=gen, dtype=torch.float64)).float(), i + 1)
            for i in range(3)
        ]
        average = FedAvg().aggregate(round_num, x, updates).double()  # the float32 mean, as FedOpt forms it
        x = strategy.aggregate(round_num, x, updates)
        p.grad = -(average - p.detach())
        opt.step()
        torch.testing.assert_close(x, p.detach(), rtol=1e-9, atol=1e-12)


def test_sgdm_equals_torch_sgd_with_momentum() -> None:
    _against_torch(FedAvgM(server_lr=0.7, momentum=0.9), lambda ps: torch.optim.SGD(ps, lr=0.7, momentum=0.9))


def test_adam_with_bias_correction_equals_torch_adam() -> None:
    s = FedAdam(server_lr=0.05, momentum=0.9, beta2=0.99, tau=1e-3, bias_correction=True)
    _against_torch(s, lambda ps: torch.optim.Adam(ps, lr=0.05, betas=(0.9, 0.99), eps=1e-3))


def test_adagrad_without_momentum_equals_torch_adagrad_started_at_tau_squared() -> None:
    s = FedAdagrad(server_lr=0.1, momentum=0.0, tau=1e-2)
    _against_torch(s, lambda ps: torch.optim.Adagrad(ps, lr=0.1, eps=1e-2, initial_accumulator_value=1e-4))


# --- properties ---------------------------------------------------------------------------------------

_finite = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, allow_infinity=False, width=32)

ALL: dict[str, Callable[[], FedOpt]] = {
    "fedavgm": FedAvgM,
    "fedavgm_lr0.3_m0": lambda: FedAvgM(server_lr=0.3, momentum=0.0),
    "fedadam": FedAdam,
    "fedadam_bias_corrected": lambda: FedAdam(server_lr=0.1, bias_correction=True),
    "fedyogi": FedYogi,
    "fedyogi_bias_corrected": lambda: FedYogi(bias_correction=True, initial_accumulator=0.5),
    "fedadagrad": FedAdagrad,
    "fedadagrad_bias_corrected": lambda: FedAdagrad(server_lr=1.0, bias_correction=True),
}


Round = tuple[torch.Tensor, list[ClientUpdate], list[int]]


@st.composite
def _rounds(draw: st.DrawFn, dim: int | None = None) -> Round:
    """Global weights, 1..5 clients (of ``dim`` weights, or 1..5), and a permutation of the clients."""
    dim, k = dim or draw(st.integers(1, 5)), draw(st.integers(1, 5))
    vector = st.lists(_finite, min_size=dim, max_size=dim)
    x = torch.tensor(draw(vector), dtype=torch.float32)
    updates = [
        ClientUpdate(i, 1, torch.tensor(draw(vector), dtype=torch.float32), draw(st.integers(1, 100))) for i in range(k)
    ]
    return x, updates, draw(st.permutations(range(k)))


@settings(max_examples=40, deadline=None)
@given(_rounds(), st.sampled_from(sorted(ALL)))
def test_order_of_updates_does_not_matter(case: Round, name: str) -> None:
    # Not bitwise: weighted_average folds in the given order (float64), so the float32 mean may differ by an ulp.
    x, updates, perm = case
    a = ALL[name]().aggregate(1, x, updates)
    b = ALL[name]().aggregate(1, x, [updates[i] for i in perm])
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(_finite, min_size=1, max_size=6),
    st.lists(st.integers(1, 1000), min_size=1, max_size=5),
    st.sampled_from(sorted(ALL)),
)
def test_identical_clients_leave_the_model_unchanged(values: list[float], sizes: list[int], name: str) -> None:
    # Δ = 0 every round and m starts at 0, so m stays 0 and x + η·0 = x exactly, round after round.
    s = ALL[name]()
    x = torch.tensor(values, dtype=torch.float32)
    for round_num in (1, 2, 3):
        new = s.aggregate(round_num, x, [ClientUpdate(i, round_num, x.clone(), n) for i, n in enumerate(sizes)])
        assert torch.equal(new, x)


def test_fedavgm_without_momentum_and_unit_lr_equals_fedavg_exactly_on_ordinary_numbers() -> None:
    # x + (mean - x) in float64 is the mean exactly when mean - x is exact in float64, as it is here.
    s, x = FedAvgM(server_lr=1.0, momentum=0.0), torch.tensor([0.5, -3.0, 7.25])
    for round_num in (1, 2, 3):
        updates = _updates(x, [[1, -2, 0.125], [3, 0.5, -4]], [round_num, 4])
        expected = FedAvg().aggregate(round_num, x, updates)
        x = s.aggregate(round_num, x, updates)
        assert torch.equal(x, expected)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5).flatmap(lambda dim: st.lists(_rounds(dim), min_size=1, max_size=3)))
def test_fedavgm_without_momentum_and_unit_lr_equals_fedavg(rounds: list[Round]) -> None:
    # Up to rounding only: with |x| ≫ |mean| (say x = 1e4, mean = 1e-30) the float64 difference mean - x is
    # rounded, so x + (mean - x) can miss the mean by ~|x|·2⁻⁵³, far below the 1e-6 tolerance.
    s = FedAvgM(server_lr=1.0, momentum=0.0)
    for round_num, (x, updates, _) in enumerate(rounds, start=1):
        got = s.aggregate(round_num, x, updates)
        torch.testing.assert_close(got, FedAvg().aggregate(round_num, x, updates), rtol=1e-6, atol=1e-6)


def _random_round(gen: torch.Generator, x: torch.Tensor, round_num: int) -> list[ClientUpdate]:
    return [ClientUpdate(i, round_num, x + torch.randn(x.shape, generator=gen), i + 2) for i in range(3)]


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(sorted(ALL)), st.integers(0, 3), st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_state_dict_round_trip_continues_identically(name: str, before: int, after: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    original, x = ALL[name](), torch.randn(4, generator=gen)
    for round_num in range(1, before + 1):
        x = original.aggregate(round_num, x, _random_round(gen, x, round_num))
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)  # tensors and plain values only: loads with weights_only=True
    buffer.seek(0)
    restored = ALL[name]()
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    x_restored = x.clone()
    for round_num in range(before + 1, before + after + 1):
        updates = _random_round(gen, x, round_num)
        x, x_restored = original.aggregate(round_num, x, updates), restored.aggregate(round_num, x_restored, updates)
        assert torch.equal(x, x_restored)
    assert restored.state_dict()["step"] == original.state_dict()["step"] == before + after


def test_state_dict_is_a_copy_and_empty_before_the_first_round() -> None:
    s = FedAdam()
    assert s.state_dict() == {"step": 0, "m": None, "v": None}
    s.aggregate(1, torch.zeros(2), _updates(torch.zeros(2), [[1, 2]], [1]))
    state = s.state_dict()
    s.aggregate(2, torch.zeros(2), _updates(torch.zeros(2), [[3, 4]], [1]))
    assert state["step"] == 1 and not torch.equal(state["m"], s.m)


def test_state_of_another_shape_is_rejected() -> None:
    s = FedAvgM()
    s.aggregate(1, torch.zeros(3), _updates(torch.zeros(3), [[1, 2, 3]], [1]))
    with pytest.raises(ValueError, match="shape"):
        s.aggregate(2, torch.zeros(2), _updates(torch.zeros(2), [[1, 2]], [1]))


# --- validation -----------------------------------------------------------------------------------------

BAD = [
    (dict(optimizer="rmsprop"), r"^strategy\.optimizer must be one of sgdm, adam, yogi, adagrad \(got 'rmsprop'\)$"),
    (dict(server_lr=-1), r"^strategy\.server_lr must be a finite number > 0 \(got -1\)$"),
    (dict(server_lr=0.0), r"^strategy\.server_lr must be a finite number > 0 \(got 0\.0\)$"),
    (dict(server_lr="fast"), r"^strategy\.server_lr must be a finite number > 0 \(got 'fast'\)$"),
    (dict(momentum=1.0), r"^strategy\.momentum must be in \[0, 1\) \(got 1\.0\)$"),
    (dict(momentum=-0.1), r"^strategy\.momentum must be in \[0, 1\)"),
    (dict(beta2=1), r"^strategy\.beta2 must be in \[0, 1\) \(got 1\)$"),
    (dict(beta2=-0.5), r"^strategy\.beta2 must be in \[0, 1\)"),
    (dict(tau=0), r"^strategy\.tau must be a finite number > 0 \(got 0\)$"),
    (dict(tau=-1e-3), r"^strategy\.tau must be a finite number > 0"),
    (dict(bias_correction="yes"), r"^strategy\.bias_correction must be true or false"),
    (dict(optimizer="sgdm", bias_correction=True), r"^strategy\.bias_correction applies to adam, yogi and adagrad"),
    (dict(initial_accumulator=-1.0), r"^strategy\.initial_accumulator must be a finite number >= 0 \(got -1\.0\)$"),
]


@pytest.mark.parametrize(("changes", "message"), BAD)
def test_bad_parameters_raise_one_line_naming_the_field(changes: dict[str, object], message: str) -> None:
    kwargs: dict[str, object] = {"optimizer": "adam", "server_lr": 0.1, **changes}
    with pytest.raises(ValueError, match=message) as error:
        FedOpt(**kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(error.value)


def test_factories_validate_too() -> None:
    with pytest.raises(ValueError, match=r"strategy\.momentum"):
        FedAvgM(momentum=1.5)
    with pytest.raises(ValueError, match=r"strategy\.tau"):
        FedYogi(tau=0.0)


def test_initial_accumulator_defaults() -> None:
    assert FedAdam(tau=0.01).initial_accumulator == pytest.approx(1e-4)  # τ² (Reddi et al.)
    assert FedYogi(tau=0.01, bias_correction=True).initial_accumulator == 0.0  # torch.optim.Adam's 0
    assert FedAdagrad(initial_accumulator=0.3).initial_accumulator == 0.3


def test_all_are_fedopt_strategies_that_accept_any_round_size() -> None:
    for make in ALL.values():
        s = make()
        assert isinstance(s, FedOpt) and isinstance(s, Strategy)
        s.check(1)
    assert FedAvgM().optimizer == "sgdm" and FedAdam().optimizer == "adam"
    assert FedYogi().optimizer == "yogi" and FedAdagrad().optimizer == "adagrad"


# --- Hydra configs ----------------------------------------------------------------------------------------

OPTIONS = {"fedavgm": "sgdm", "fedadam": "adam", "fedyogi": "yogi", "fedadagrad": "adagrad"}
# that each parameter is overridable from the command line: tests/strategy/test_configs.py, for every strategy


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_config_composes_instantiates_and_lists_every_parameter_with_its_default(option: str) -> None:
    cfg = compose([f"strategy={option}"])
    strategy = instantiate(cfg.strategy)
    assert isinstance(strategy, FedOpt) and strategy.optimizer == OPTIONS[option]
    params = inspect.signature(get_method(cfg.strategy._target_)).parameters
    assert set(cfg.strategy) - {"_target_"} == set(params)
    assert all(cfg.strategy[name] == p.default for name, p in params.items())
    new = strategy.aggregate(
        1, torch.full((5,), 0.5), [ClientUpdate(0, 1, torch.ones(5), 2), ClientUpdate(1, 1, torch.zeros(5), 2)]
    )
    assert new.shape == (5,) and torch.isfinite(new).all()


def test_a_bad_value_from_the_command_line_names_the_field() -> None:
    with pytest.raises(InstantiationException) as error:
        instantiate(compose(["strategy=fedadam", "strategy.tau=0"]).strategy)
    assert isinstance(error.value.__cause__, ValueError)
    assert str(error.value.__cause__) == "strategy.tau must be a finite number > 0 (got 0)"
