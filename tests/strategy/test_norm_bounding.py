"""Norm bounding (Sun et al. 2019): hand-computed answers, order independence, its metrics, bad arguments and a
short run composed as on the command line."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import torch

from fedsim.cli.run import build_server, compose
from fedsim.core.types import ClientUpdate
from fedsim.strategy import FedAvg, NormBounding, Strategy

GLOBAL = torch.tensor([1.0, 1.0])


def _round(
    deltas: list[list[float]], sizes: list[int], ids: list[int] | None = None, start: torch.Tensor = GLOBAL
) -> list[ClientUpdate]:
    """Updates whose trained weights are ``start + delta`` (float32)."""
    ids = ids if ids is not None else list(range(len(deltas)))
    return [ClientUpdate(i, 1, start + torch.tensor(d), n) for i, d, n in zip(ids, deltas, sizes, strict=True)]


# client 0 moves by (6, 8): norm 10, scaled by M/10 = 1/2 to (3, 4); client 1 by (0, -2): norm 2 <= 5, kept
DELTAS, SIZES = [[6.0, 8.0], [0.0, -2.0]], [1, 3]


def test_known_answer_example_weighted() -> None:
    # weights 1/4, 3/4: (1 + 3/4 + 0, 1 + 4/4 - 6/4) = (1.75, 0.5)
    strategy = NormBounding(max_norm=5.0)
    new = strategy.aggregate(1, GLOBAL, _round(DELTAS, SIZES))
    assert new.dtype == torch.float32 and torch.equal(new, torch.tensor([1.75, 0.5]))
    # the bound is only on the size of a change: FedAvg would give (1 + 6/4, 1 + (8 - 6)/4) = (2.5, 1.5)
    assert torch.equal(FedAvg().aggregate(1, GLOBAL, _round(DELTAS, SIZES)), torch.tensor([2.5, 1.5]))
    assert strategy.round_metrics(1) == {"clipped_fraction": 0.5, "delta_norm_median": 6.0, "delta_norm_max": 10.0}
    assert strategy.client_metrics(1) == {
        0: {"delta_norm": 10.0, "clip_factor": 0.5},
        1: {"delta_norm": 2.0, "clip_factor": 1.0},
    }


def test_known_answer_unweighted_ignores_example_counts() -> None:
    # (1 + (3 + 0)/2, 1 + (4 - 2)/2) = (2.5, 2), whatever the clients claim about their data
    for sizes in ([1, 3], [10**6, 1]):
        new = NormBounding(max_norm=5.0, weighted=False).aggregate(1, GLOBAL, _round(DELTAS, sizes))
        assert torch.equal(new, torch.tensor([2.5, 2.0]))


def test_a_boosted_outlier_moves_the_model_by_exactly_its_share_of_the_bound() -> None:
    # a model-replacement update (1000x): scaled to norm M = 1 exactly, then weighted 1/2 -> (0.5, 0, 0, 0)
    zero, honest = torch.zeros(4), [0.0, 0.0, 0.0, 0.0]
    for boost in (1e3, 1e6):
        new = NormBounding(max_norm=1.0).aggregate(
            1, zero, _round([[boost, 0.0, 0.0, 0.0], honest], [5, 5], start=zero)
        )
        assert torch.equal(new, torch.tensor([0.5, 0.0, 0.0, 0.0]))
    # in four dimensions (8, 8, 8, 8) has norm 16: with M = 4 it becomes (2, 2, 2, 2), weighted 1/4 -> 0.5 each
    new = NormBounding(max_norm=4.0).aggregate(1, zero, _round([[8.0] * 4, honest], [1, 3], start=zero))
    assert torch.equal(new, torch.full((4,), 0.5))


def test_is_fedavg_when_no_change_reaches_the_bound() -> None:
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(50, generator=gen)
    updates = [ClientUpdate(i, 1, start + 0.01 * torch.randn(50, generator=gen), n) for i, n in enumerate([3, 1, 7, 2])]
    strategy = NormBounding(max_norm=10.0)
    torch.testing.assert_close(
        strategy.aggregate(1, start, updates), FedAvg().aggregate(1, start, updates), rtol=0, atol=1e-6
    )
    assert strategy.round_metrics(1)["clipped_fraction"] == 0.0


def test_the_order_of_updates_does_not_matter_bitwise() -> None:
    # float64 weights: the sum's rounding shows (cast to float32, most orders would round to the same values)
    gen = torch.Generator().manual_seed(1)
    start = torch.randn(30, generator=gen, dtype=torch.float64)
    deltas = [torch.randn(30, generator=gen, dtype=torch.float64) * s for s in (0.1, 0.5, 3.0, 40.0)]
    updates = [ClientUpdate(i, 1, start + d, n) for i, d, n in zip([7, 2, 9, 4], deltas, [5, 1, 3, 8], strict=True)]
    for weighted in (True, False):
        strategy = NormBounding(max_norm=1.0, weighted=weighted)
        first = strategy.aggregate(1, start, updates)
        for perm in itertools.permutations(updates):
            assert torch.equal(strategy.aggregate(1, start, list(perm)), first)


def test_stateless_and_leaves_its_inputs_alone() -> None:
    updates = _round(DELTAS, SIZES)
    kept, start = [u.params.clone() for u in updates], GLOBAL.clone()
    strategy = NormBounding(max_norm=5.0)
    assert isinstance(strategy, Strategy) and strategy.state_dict() == {}
    strategy.aggregate(1, GLOBAL, updates)
    assert all(torch.equal(u.params, k) for u, k in zip(updates, kept, strict=True)) and torch.equal(GLOBAL, start)


def test_an_empty_round_is_refused() -> None:
    with pytest.raises(ValueError):
        NormBounding().aggregate(1, GLOBAL, [])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: NormBounding(max_norm=0), r"^strategy\.max_norm must be a finite number > 0 \(got 0\)$"),
        (lambda: NormBounding(max_norm=-1.0), r"^strategy\.max_norm must be a finite number > 0 \(got -1\.0\)$"),
        (lambda: NormBounding(max_norm=math.nan), r"^strategy\.max_norm must be a finite number > 0 \(got nan\)$"),
        (lambda: NormBounding(max_norm=math.inf), r"^strategy\.max_norm must be a finite number > 0 \(got inf\)$"),
        (lambda: NormBounding(max_norm="1"), r"^strategy\.max_norm must be a finite number > 0 \(got '1'\)$"),
        (lambda: NormBounding(max_norm=True), r"^strategy\.max_norm must be a finite number > 0 \(got True\)$"),
        (lambda: NormBounding(weighted="yes"), r"^strategy\.weighted must be true or false \(got 'yes'\)$"),
        (lambda: NormBounding(weighted=1), r"^strategy\.weighted must be true or false \(got 1\)$"),
    ],
)
def test_bad_arguments_raise_one_line_naming_the_field(make: Callable[[], Strategy], message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        make()
    assert "\n" not in str(error.value)


def test_a_bad_value_from_the_command_line_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"strategy\.max_norm"):
        build_server(compose(["strategy=norm_bounding", "strategy.max_norm=-1"]))


def test_the_option_composes_and_runs_two_rounds() -> None:
    cfg = compose(["strategy=norm_bounding", "num_rounds=2", "logger=quiet"])
    assert cfg.strategy.max_norm == 1.0 and cfg.strategy.weighted is True
    history = build_server(cfg).run().history
    assert len(history) == 2
    for row in history:
        assert 0.0 <= row["strategy/clipped_fraction"] <= 1.0
        assert 0.0 < row["strategy/delta_norm_median"] <= row["strategy/delta_norm_max"] < math.inf
