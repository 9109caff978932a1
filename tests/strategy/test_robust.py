"""Byzantine-robust aggregation (Median, TrimmedMean, Krum / Multi-Krum) and the pure functions under it:
hand-computed answers, properties with outliers, round-size checks, validation and the Hydra configs."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fedsim.cli.run import compose
from fedsim.core.types import ClientUpdate
from fedsim.strategy import Krum, Median, Strategy, TrimmedMean
from fedsim.strategy import functional as F


def _updates(rows: list[list[float]], sizes: list[int] | None = None) -> list[ClientUpdate]:
    sizes = sizes or [1] * len(rows)
    return [
        ClientUpdate(i, 1, torch.tensor(r, dtype=torch.float32), n)
        for i, (r, n) in enumerate(zip(rows, sizes, strict=True))
    ]


ROWS3 = [[1.0, 5.0, -2.0], [3.0, -1.0, 0.0], [2.0, 100.0, 4.0]]
ROWS5 = [*ROWS3, [10.0, 0.0, 1.0], [4.0, 7.0, -8.0]]
GLOBAL = torch.full((3,), 50.0)  # robust rules do not look at the global weights

# --- known answers ---------------------------------------------------------------------------------------


def test_median_known_answer_odd() -> None:
    # per coordinate: sorted (1, 2, 3) -> 2;  (-1, 5, 100) -> 5;  (-2, 0, 4) -> 0.  Example counts are ignored.
    new = Median().aggregate(1, GLOBAL, _updates(ROWS3, [1, 1000, 1]))
    assert torch.equal(new, torch.tensor([2.0, 5.0, 0.0]))


def test_median_known_answer_even_is_the_mean_of_the_two_middle_values() -> None:
    # with [10, 0, 1]: (1, 2, 3, 10) -> (2+3)/2 = 2.5;  (-1, 0, 5, 100) -> 2.5;  (-2, 0, 1, 4) -> 0.5
    new = Median().aggregate(1, GLOBAL, _updates(ROWS5[:4]))
    assert torch.equal(new, torch.tensor([2.5, 2.5, 0.5]))


def test_trimmed_mean_known_answers() -> None:
    updates = _updates(ROWS5, [1, 2, 3, 4, 1000])
    # β = 0.2, n = 5: trim ⌊1⌋ value at each end.  (1, [2, 3, 4], 10) -> 3;  (-1, [0, 5, 7], 100) -> 4;
    #   (-8, [-2, 0, 1], 4) -> -1/3
    torch.testing.assert_close(TrimmedMean(0.2).aggregate(1, GLOBAL, updates), torch.tensor([3.0, 4.0, -1 / 3]))
    # β = 0.4: trim 2 at each end, which leaves the median: [3, 5, 0]
    assert torch.equal(TrimmedMean(0.4).aggregate(1, GLOBAL, updates), torch.tensor([3.0, 5.0, 0.0]))
    # β = 0: the unweighted mean: (1+3+2+10+4)/5 = 4;  (5-1+100+0+7)/5 = 22.2;  (-2+0+4+1-8)/5 = -1
    torch.testing.assert_close(TrimmedMean(0.0).aggregate(1, GLOBAL, updates), torch.tensor([4.0, 22.2, -1.0]))


# Five points on the line (t, 2t), t = 0, 1, 3, 5, 100, so ‖xᵢ - xⱼ‖² = 5·(tᵢ - tⱼ)².  f = 1: n - f - 2 = 2 neighbours.
#   t=0: 5·(1 + 9) = 50    t=1: 5·(1 + 4) = 25    t=3: 5·(4 + 4) = 40    t=5: 5·(4 + 16) = 100
#   t=100: 5·(95² + 97²) = 92170
LINE = [[t, 2.0 * t] for t in (0.0, 1.0, 3.0, 5.0, 100.0)]
LINE_SIZES = [1, 1, 1, 1, 10**6]  # the outlier claims a huge data set: no effect, Krum is unweighted


def test_krum_scores_and_selection_known_answer() -> None:
    stack = torch.tensor(LINE)
    assert torch.equal(F.krum_scores(stack, f=1), torch.tensor([50.0, 25.0, 40.0, 100.0, 92170.0], dtype=torch.float64))
    assert F.krum_select(stack, f=1, m=1) == [1]
    assert F.krum_select(stack, f=1, m=3) == [1, 2, 0]  # best first


def test_krum_known_answer() -> None:
    # the best score (25) is t = 1: Krum returns that client's weights exactly
    strategy = Krum(f=1)
    assert torch.equal(strategy.aggregate(1, torch.zeros(2), _updates(LINE, LINE_SIZES)), torch.tensor([1.0, 2.0]))
    # each client's row says whether its update was kept
    assert strategy.client_metrics(1) == {i: {"selected": float(i == 1)} for i in range(len(LINE))}


def test_multi_krum_known_answers_are_unweighted_means() -> None:
    # m = 3: t = 1, 3, 0 -> mean t = 4/3, i.e. [4/3, 8/3];  m = 4 = n - f: t = 0, 1, 3, 5 -> 9/4, i.e. [2.25, 4.5]
    updates = _updates(LINE, LINE_SIZES)
    torch.testing.assert_close(Krum(f=1, m=3).aggregate(1, torch.zeros(2), updates), torch.tensor([4 / 3, 8 / 3]))
    assert torch.equal(Krum(f=1, m=4).aggregate(1, torch.zeros(2), updates), torch.tensor([2.25, 4.5]))


def test_ties_in_krum_score_go_to_the_lower_index() -> None:
    # t = 0, 1, 2 with f = 0 (one neighbour): every score is 5·1 = 5
    stack = torch.tensor([[0.0, 0.0], [1.0, 2.0], [2.0, 4.0]])
    assert F.krum_select(stack, f=0, m=2) == [0, 1]


def test_robust_strategies_are_stateless_and_leave_inputs_alone() -> None:
    updates = _updates(ROWS5)
    kept = [u.params.clone() for u in updates]
    for s in (Median(), TrimmedMean(0.2), Krum(f=1, m=2)):
        assert isinstance(s, Strategy) and s.state_dict() == {}
        s.load_state_dict({})
        new = s.aggregate(1, GLOBAL, updates)
        assert new.shape == (3,) and new.dtype == torch.float32
    assert all(torch.equal(u.params, k) for u, k in zip(updates, kept, strict=True))


# --- round-size checks (start-up) and aggregate-time errors ---------------------------------------------------


def test_krum_rejects_too_small_rounds_with_one_line() -> None:
    with pytest.raises(ValueError) as error:
        Krum(f=2).aggregate(1, torch.zeros(3), _updates([[float(i)] * 3 for i in range(5)]))
    assert str(error.value) == (
        "strategy=krum needs at least 2f+3 = 7 clients per round (f=2) but the round has 5; "
        "lower strategy.f or raise clients_per_round"
    )
    with pytest.raises(ValueError) as error:
        Krum(f=2).check(5)
    assert str(error.value) == (
        "strategy=krum needs at least 2f+3 = 7 clients per round (f=2) but clients_per_round "
        "is 5; lower strategy.f or raise clients_per_round"
    )
    Krum(f=2).check(7)
    Krum(f=0).check(3)


def test_krum_rejects_m_above_n_minus_f() -> None:
    with pytest.raises(
        ValueError, match=r"^strategy=krum needs m <= n - f = 4 \(m=5, f=1\) but clients_per_round is 5; "
    ):
        Krum(f=1, m=5).check(5)
    with pytest.raises(ValueError, match=r"lower strategy\.m"):
        Krum(f=1, m=5).aggregate(1, torch.zeros(2), _updates(LINE))
    Krum(f=1, m=4).check(5)


def test_trimmed_mean_check() -> None:
    TrimmedMean(0.1).check(10)  # trims 1 per side
    TrimmedMean(0.0).check(1)  # the plain mean works for any round
    TrimmedMean(0.49).check(3)  # trims ⌊1.47⌋ = 1 per side, keeps 1
    with pytest.raises(
        ValueError, match=r"^strategy=trimmed_mean with beta=0\.1 trims floor\(beta\*5\) = 0 of 5 clients"
    ):
        TrimmedMean(0.1).check(5)  # β > 0 but nothing trimmed would silently be the plain mean


def test_trimmed_mean_refuses_a_round_that_failures_left_too_small() -> None:
    # check(10) passed (trims 1 per side), but failures left 9 updates: floor(0.1*9) = 0 would be the plain mean
    TrimmedMean(0.1).check(10)
    nine = _updates([[float(i)] * 3 for i in range(9)])
    with pytest.raises(ValueError) as error:
        TrimmedMean(0.1).aggregate(1, GLOBAL, nine)
    assert str(error.value) == (
        "strategy=trimmed_mean with beta=0.1 trims floor(beta*9) = 0 of 9 updates left in the "
        "round; raise strategy.beta or min_success_fraction, or set strategy.beta=0 for the mean"
    )
    torch.testing.assert_close(
        TrimmedMean(0.1).aggregate(1, GLOBAL, [*nine, *_updates([[100.0] * 3])]), torch.full((3,), 4.5)
    )  # 10 updates: trims 0 and 100, the mean of 1..8
    assert torch.equal(TrimmedMean(0.0).aggregate(1, GLOBAL, nine), torch.full((3,), 4.0))  # beta=0 is the mean
    with pytest.raises(ValueError, match=r"trims floor\(beta\*1\) = 0 of 1 updates left"):
        TrimmedMean(0.49).aggregate(1, GLOBAL, nine[:1])


def test_krum_refuses_a_round_that_failures_left_too_small() -> None:
    Krum(f=1).check(5)
    with pytest.raises(
        ValueError, match=r"^strategy=krum needs at least 2f\+3 = 5 clients per round \(f=1\) but the round has 4; "
    ):
        Krum(f=1).aggregate(1, torch.zeros(2), _updates(LINE[:4]))


def _trims(n: int, beta: float) -> bool:
    """Whether TrimmedMean(beta) accepts a round of n updates (beta = 0, or it trims at least one per side)."""
    return beta == 0 or F.trim_count(n, beta) > 0


def test_other_strategies_accept_any_round_size() -> None:
    Strategy().check(1)
    Median().check(1)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Krum(f=-1), r"^strategy\.f must be an integer >= 0 \(got -1\)$"),
        (lambda: Krum(f=1.5), r"^strategy\.f must be an integer >= 0 \(got 1\.5\)$"),
        (lambda: Krum(f=1, m=0), r"^strategy\.m must be an integer >= 1 \(got 0\)$"),
        (lambda: Krum(f=1, m="2"), r"^strategy\.m must be an integer >= 1 \(got '2'\)$"),
        (lambda: TrimmedMean(0.5), r"^strategy\.beta must be in \[0, 0\.5\) \(got 0\.5\)$"),
        (lambda: TrimmedMean(-0.1), r"^strategy\.beta must be in \[0, 0\.5\)"),
        (lambda: TrimmedMean("a"), r"^strategy\.beta must be in \[0, 0\.5\) \(got 'a'\)$"),
    ],
)
def test_bad_parameters_raise_one_line_naming_the_field(make: Callable[[], Strategy], message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        make()
    assert "\n" not in str(error.value)


def test_empty_rounds_are_rejected() -> None:
    for s in (Median(), TrimmedMean(0.1)):
        with pytest.raises(ValueError):
            s.aggregate(1, GLOBAL, [])


# --- the pure functions -----------------------------------------------------------------------------------


def test_trim_count_is_floor_without_float_surprises() -> None:
    assert [F.trim_count(10, b) for b in (0.0, 0.09, 0.1, 0.3, 0.49)] == [0, 0, 1, 3, 4]
    assert F.trim_count(100, 0.29) == 29  # 0.29 * 100 is 28.999999999999996 in floating point


def test_functions_match_numpy_references_and_keep_shape() -> None:
    gen = torch.Generator().manual_seed(3)
    for n in (1, 2, 5, 6):
        stack = torch.randn(n, 4, 3, generator=gen)
        ref = np.sort(stack.double().numpy(), axis=0)
        torch.testing.assert_close(F.coordinate_median(stack), torch.from_numpy(np.median(ref, axis=0)).float())
        k = F.trim_count(n, 0.3)
        expected = torch.from_numpy(ref[k : n - k].mean(axis=0)).float()
        torch.testing.assert_close(F.trimmed_mean(stack, 0.3), expected)
        assert F.trimmed_mean(stack, 0.3).shape == (4, 3)
    distances = F.pairwise_squared_distances(stack)
    torch.testing.assert_close(
        distances, torch.cdist(stack.reshape(6, -1).double(), stack.reshape(6, -1).double()) ** 2
    )
    assert torch.equal(distances, distances.T) and torch.all(distances.diagonal() == 0)


def test_chunked_sorting_equals_one_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    stack = torch.randn(5, 23, generator=torch.Generator().manual_seed(1))
    whole = (F.coordinate_median(stack), F.trimmed_mean(stack, 0.2))
    monkeypatch.setattr(F, "_COLUMNS_PER_CHUNK", 4)
    assert torch.equal(F.coordinate_median(stack), whole[0]) and torch.equal(F.trimmed_mean(stack, 0.2), whole[1])


def test_functions_reject_impossible_requests() -> None:
    with pytest.raises(ValueError):
        F.trimmed_mean(torch.ones(3, 2), 0.5)
    with pytest.raises(ValueError):
        F.krum_scores(torch.ones(3, 2), f=1)  # n - f - 2 = 0 neighbours
    with pytest.raises(ValueError):
        F.krum_select(torch.ones(5, 2), f=1, m=6)
    with pytest.raises(ValueError):
        F.coordinate_median(torch.ones(0, 2))


# --- properties -------------------------------------------------------------------------------------------

_finite = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, allow_infinity=False, width=32)
_honest = st.floats(min_value=-10, max_value=10, allow_nan=False, width=32)
_huge = st.floats(min_value=1e6, max_value=1e8, width=32)
BETAS = [0.0, 0.1, 0.25, 0.4, 0.49]


@st.composite
def _stack_and_perm(draw: st.DrawFn) -> tuple[list[ClientUpdate], list[int]]:
    dim, k = draw(st.integers(1, 4)), draw(st.integers(1, 7))
    rows = [draw(st.lists(_finite, min_size=dim, max_size=dim)) for _ in range(k)]
    return _updates(rows, [draw(st.integers(1, 100)) for _ in range(k)]), draw(st.permutations(range(k)))


@settings(max_examples=60, deadline=None)
@given(_stack_and_perm(), st.sampled_from(BETAS))
def test_median_and_trimmed_mean_ignore_client_order_bitwise(
    case: tuple[list[ClientUpdate], list[int]], beta: float
) -> None:
    updates, perm = case
    shuffled = [updates[i] for i in perm]
    x = torch.zeros_like(updates[0].params)
    assert torch.equal(Median().aggregate(1, x, updates), Median().aggregate(1, x, shuffled))
    if _trims(len(updates), beta):  # otherwise TrimmedMean refuses the round (see below)
        assert torch.equal(TrimmedMean(beta).aggregate(1, x, updates), TrimmedMean(beta).aggregate(1, x, shuffled))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(0, 3), st.integers(0, 4), st.data())
def test_krum_ignores_client_order_on_generic_data(seed: int, f: int, extra: int, data: st.DataObject) -> None:
    # generic (random normal) data; with n - f - 2 = 1 neighbour (f = 0, n = 3) the closest pair still ties
    n = 2 * f + 3 + extra
    m = data.draw(st.integers(1, n - f))
    stack = torch.randn(n, 5, generator=torch.Generator().manual_seed(seed))
    updates = [ClientUpdate(i, 1, stack[i], 1) for i in range(n)]
    perm = data.draw(st.permutations(range(n)))
    a = Krum(f, m).aggregate(1, torch.zeros(5), updates)
    assert torch.equal(a, Krum(f, m).aggregate(1, torch.zeros(5), [updates[i] for i in perm]))


@settings(max_examples=40, deadline=None)
@given(_stack_and_perm(), st.integers(1, 3))
def test_krum_ignores_client_order_even_with_ties(case: tuple[list[ClientUpdate], list[int]], m: int) -> None:
    # Krum sorts the round by client id itself, so equal scores (frequent in these small drawn rounds)
    # resolve the same way whatever order the updates arrive in
    updates, perm = case
    assume(len(updates) >= 3)
    krum = Krum(f=0, m=min(m, len(updates)))
    x = torch.zeros_like(updates[0].params)
    assert torch.equal(krum.aggregate(1, x, updates), krum.aggregate(1, x, [updates[i] for i in perm]))


@settings(max_examples=40, deadline=None)
@given(st.lists(_finite, min_size=1, max_size=5), st.integers(0, 3), st.integers(0, 3), st.sampled_from(BETAS))
def test_identical_clients_leave_the_model_unchanged(values: list[float], f: int, extra: int, beta: float) -> None:
    x = torch.tensor(values, dtype=torch.float32)
    n = 2 * f + 3 + extra
    updates = [ClientUpdate(i, 1, x.clone(), i + 1) for i in range(n)]
    for s in (Median(), TrimmedMean(beta if _trims(n, beta) else 0.0), Krum(f), Krum(f, n - f)):
        assert torch.equal(s.aggregate(1, x, updates), x)


@st.composite
def _attacked_round(draw: st.DrawFn) -> tuple[list[ClientUpdate], torch.Tensor, int]:
    """n ≥ 2f+3 clients of which f send huge values (either sign), at random positions; also the honest stack."""
    f, dim = draw(st.integers(0, 3)), draw(st.integers(1, 4))
    n = 2 * f + 3 + draw(st.integers(0, 3))
    honest = [draw(st.lists(_honest, min_size=dim, max_size=dim)) for _ in range(n - f)]
    attackers = [[draw(_huge) * draw(st.sampled_from([-1.0, 1.0])) for _ in range(dim)] for _ in range(f)]
    rows = [*honest, *attackers]
    order = draw(st.permutations(range(n)))
    return _updates([rows[i] for i in order]), torch.tensor(honest, dtype=torch.float32), f


@settings(max_examples=80, deadline=None)
@given(_attacked_round(), st.data())
def test_results_stay_within_the_honest_range_with_up_to_f_outliers(
    case: tuple[list[ClientUpdate], torch.Tensor, int], data: st.DataObject
) -> None:
    updates, honest, f = case
    n = len(updates)
    low, high = honest.min(dim=0).values, honest.max(dim=0).values
    beta = (f + 0.5) / n if f else 0.0  # < 0.5 since n ≥ 2f + 3, and trims exactly f per side (0: the mean)
    assert F.trim_count(n, beta) == f
    m = data.draw(st.integers(1, n - f))
    for s in (Median(), TrimmedMean(beta), Krum(f), Krum(f, m)):
        got = s.aggregate(1, torch.zeros_like(low), updates)
        assert torch.all(got >= low) and torch.all(got <= high), (type(s).__name__, got, low, high)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(_finite, min_size=3, max_size=3), min_size=1, max_size=7), st.sampled_from(BETAS))
def test_median_and_trimmed_mean_stay_within_all_clients_range(rows: list[list[float]], beta: float) -> None:
    stack = torch.tensor(rows, dtype=torch.float32)
    low, high = stack.min(dim=0).values, stack.max(dim=0).values
    for got in (F.coordinate_median(stack), F.trimmed_mean(stack, beta)):
        assert torch.all(got >= low) and torch.all(got <= high)
    assume(len(rows) % 2 == 1)
    assert torch.equal(
        F.coordinate_median(stack), F.trimmed_mean(stack, 0.5 - 0.5 / len(rows) if len(rows) > 1 else 0.0)
    )


# --- Hydra configs ------------------------------------------------------------------------------------------

OPTIONS = {"median": Median, "trimmed_mean": TrimmedMean, "krum": Krum}
OVERRIDES = {"beta": ("0.25", 0.25), "f": ("2", 2), "m": ("3", 3)}


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_config_composes_instantiates_and_lists_every_parameter_with_its_default(option: str) -> None:
    cfg = compose([f"strategy={option}"])
    strategy = instantiate(cfg.strategy)
    assert type(strategy) is OPTIONS[option] is get_class(cfg.strategy._target_)
    params = inspect.signature(OPTIONS[option]).parameters
    assert set(cfg.strategy) - {"_target_"} == set(params)
    assert all(cfg.strategy[name] == p.default for name, p in params.items())
    strategy.check(cfg.clients_per_round)  # the defaults work with the default round size
    updates = _updates([[float(i), -float(i), 0.5] for i in range(cfg.clients_per_round)])
    new = strategy.aggregate(1, torch.zeros(3), updates)
    assert new.shape == (3,) and torch.isfinite(new).all()


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_every_parameter_is_overridable_from_the_command_line(option: str) -> None:
    keys = [k for k in compose([f"strategy={option}"]).strategy if k != "_target_"]
    for key in keys:
        text, value = OVERRIDES[key]
        strategy = instantiate(compose([f"strategy={option}", f"strategy.{key}={text}"]).strategy)
        assert getattr(strategy, key) == value, key


def test_a_bad_value_from_the_command_line_names_the_field() -> None:
    with pytest.raises(InstantiationException) as error:
        instantiate(compose(["strategy=krum", "strategy.f=-1"]).strategy)
    assert str(error.value.__cause__) == "strategy.f must be an integer >= 0 (got -1)"
