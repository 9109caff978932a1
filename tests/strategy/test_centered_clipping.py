"""Centred clipping (Karimireddy et al., ICML 2021): hand-computed answers over one and two iterations and two rounds,
the centre carried between rounds and through state_dict / a checkpoint, order independence, bad arguments, and
short runs composed as on the command line (one resumed bitwise)."""

from __future__ import annotations

import io
import itertools
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fedsim.cli.run import build_server, compose, run_config
from fedsim.core.types import ClientUpdate
from fedsim.strategy import CenteredClipping, NormBounding, Strategy

X = torch.tensor([0.5, -1.0])
# three honest clients around (1, 0) and one far outlier; tau = 2
HONEST = [[1.0, 0.5], [1.0, -0.5], [1.0, 0.0]]
OUTLIER = [100.0, 0.0]


def _round(start: torch.Tensor, deltas: list[list[float]], sizes: list[int] | None = None) -> list[ClientUpdate]:
    """Updates whose trained weights are ``start + delta`` (float32), client ids 0, 1, ..."""
    sizes = sizes or [1] * len(deltas)
    return [ClientUpdate(i, 1, start + torch.tensor(d), n) for i, (d, n) in enumerate(zip(deltas, sizes, strict=True))]


def test_one_iteration_from_a_zero_centre_known_answer() -> None:
    # v = 0: the honest changes have norms 1.118, 1.118, 1 <= 2 and are kept; (100, 0) is clipped to (2, 0).
    # v = ((1 + 1 + 1 + 2) / 4, (0.5 - 0.5 + 0 + 0) / 4) = (1.25, 0);  w = (0.5, -1) + v = (1.75, -1)
    strategy = CenteredClipping(tau=2.0, iterations=1)
    new = strategy.aggregate(1, X, _round(X, [*HONEST, OUTLIER], sizes=[1, 1, 1, 10**6]))  # unweighted
    assert new.dtype == torch.float32 and torch.equal(new, torch.tensor([1.75, -1.0]))
    assert torch.equal(strategy.state_dict()["center"], torch.tensor([1.25, 0.0], dtype=torch.float64))
    assert strategy.round_metrics(1) == {"clipped_fraction": 0.25, "center_norm": 1.25}


def test_two_iterations_known_answer() -> None:
    # second iteration from v = (1.25, 0): Δᵢ − v = (−0.25, 0.5), (−0.25, −0.5), (−0.25, 0), all kept, and
    # (98.75, 0), clipped to (2, 0); their mean is (1.25 / 4, 0) = (0.3125, 0), so v = (1.5625, 0)
    strategy = CenteredClipping(tau=2.0, iterations=2)
    new = strategy.aggregate(1, X, _round(X, [*HONEST, OUTLIER]))
    assert torch.equal(new, torch.tensor([2.0625, -1.0]))
    assert strategy.round_metrics(1) == {"clipped_fraction": 0.25, "center_norm": 1.5625}


def test_the_centre_carries_over_to_the_next_round() -> None:
    # round 2 starts from round 1's v = (1.25, 0): with the same changes, one iteration of round 2 is the second
    # iteration above, v = (1.5625, 0), and w = (1.75, -1) + v = (3.3125, -1)
    strategy = CenteredClipping(tau=2.0)
    w1 = strategy.aggregate(1, X, _round(X, [*HONEST, OUTLIER]))
    w2 = strategy.aggregate(2, w1, _round(w1, [*HONEST, OUTLIER]))
    assert torch.equal(w2, torch.tensor([3.3125, -1.0]))
    # a strategy that forgot the centre (v = 0 again) gives round 1's step, (1.25, 0)
    assert torch.equal(
        CenteredClipping(tau=2.0).aggregate(2, w1, _round(w1, [*HONEST, OUTLIER])), torch.tensor([3.0, -1.0])
    )


def test_the_centre_survives_state_dict_and_a_checkpoint() -> None:
    strategy = CenteredClipping(tau=2.0)
    assert strategy.state_dict() == {"center": None}
    w1 = strategy.aggregate(1, X, _round(X, [*HONEST, OUTLIER]))
    state = strategy.state_dict()
    state["center"].add_(100.0)  # a copy: changing it leaves the strategy alone
    buffer = io.BytesIO()
    torch.save(strategy.state_dict(), buffer)  # as a checkpoint stores it, and loads it (weights_only)
    buffer.seek(0)
    resumed = CenteredClipping(tau=2.0)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    round_two = _round(w1, [*HONEST, OUTLIER])
    assert torch.equal(resumed.aggregate(2, w1, round_two), strategy.aggregate(2, w1, round_two))
    assert torch.equal(resumed.state_dict()["center"], torch.tensor([1.5625, 0.0], dtype=torch.float64))
    resumed.load_state_dict({"center": None})  # back to a first round
    assert torch.equal(resumed.aggregate(1, X, _round(X, [*HONEST, OUTLIER])), torch.tensor([1.75, -1.0]))


def test_a_centre_of_another_size_is_refused_in_one_line() -> None:
    strategy = CenteredClipping()
    strategy.load_state_dict({"center": torch.zeros(3, dtype=torch.float64)})
    with pytest.raises(ValueError, match=r"^the centre has shape \(3,\), the model \(2,\)$"):
        strategy.aggregate(1, X, _round(X, HONEST))


def test_first_round_with_one_iteration_is_unweighted_norm_bounding() -> None:
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(20, generator=gen)
    updates = [
        ClientUpdate(i, 1, start + torch.randn(20, generator=gen) * s, n)
        for i, (s, n) in enumerate([(0.1, 3), (1.0, 1), (5.0, 9)])
    ]
    torch.testing.assert_close(
        CenteredClipping(tau=1.0).aggregate(1, start, updates),
        NormBounding(max_norm=1.0, weighted=False).aggregate(1, start, updates),
        rtol=0,
        atol=1e-6,
    )


@pytest.mark.parametrize("iterations", [1, 3])
def test_a_radius_that_clips_nothing_gives_the_unweighted_mean_whatever_the_centre(iterations: int) -> None:
    # v + mean(Δᵢ − v) = mean(Δᵢ): every round moves the model by the plain mean of the changes
    strategy = CenteredClipping(tau=1e6, iterations=iterations)
    w = X
    for round_num, deltas in enumerate(([[1.0, 2.0], [3.0, -2.0]], [[-0.5, 0.25], [0.5, 0.75]]), start=1):
        w = strategy.aggregate(round_num, w, _round(w, deltas, sizes=[1, 5]))
        assert strategy.round_metrics(round_num)["clipped_fraction"] == 0.0
    assert torch.equal(w, X + torch.tensor([2.0, 0.0]) + torch.tensor([0.0, 0.5]))


def test_the_order_of_updates_does_not_matter_bitwise() -> None:
    gen = torch.Generator().manual_seed(1)
    start = torch.randn(30, generator=gen)
    deltas = [torch.randn(30, generator=gen) * s for s in (0.1, 0.5, 3.0, 40.0)]
    updates = [ClientUpdate(i, 1, start + d, 1) for i, d in zip([7, 2, 9, 4], deltas, strict=True)]

    def two_rounds(order: list[ClientUpdate]) -> list[torch.Tensor]:
        strategy = CenteredClipping(tau=0.5, iterations=3)  # round 2 starts from round 1's centre
        return [
            strategy.aggregate(1, start, order),
            strategy.aggregate(2, start, order),
            strategy.state_dict()["center"],
        ]

    first = two_rounds(updates)
    for perm in itertools.permutations(updates):
        assert all(torch.equal(a, b) for a, b in zip(two_rounds(list(perm)), first, strict=True))


def test_leaves_its_inputs_alone_and_refuses_an_empty_round() -> None:
    updates = _round(X, [*HONEST, OUTLIER])
    kept, start = [u.params.clone() for u in updates], X.clone()
    CenteredClipping(tau=2.0, iterations=2).aggregate(1, X, updates)
    assert all(torch.equal(u.params, k) for u, k in zip(updates, kept, strict=True)) and torch.equal(X, start)
    with pytest.raises(ValueError):
        CenteredClipping().aggregate(1, X, [])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: CenteredClipping(tau=0), r"^strategy\.tau must be a finite number > 0 \(got 0\)$"),
        (lambda: CenteredClipping(tau=-0.5), r"^strategy\.tau must be a finite number > 0 \(got -0\.5\)$"),
        (lambda: CenteredClipping(tau=math.nan), r"^strategy\.tau must be a finite number > 0 \(got nan\)$"),
        (lambda: CenteredClipping(tau=math.inf), r"^strategy\.tau must be a finite number > 0 \(got inf\)$"),
        (lambda: CenteredClipping(tau="1"), r"^strategy\.tau must be a finite number > 0 \(got '1'\)$"),
        (lambda: CenteredClipping(iterations=0), r"^strategy\.iterations must be an integer >= 1 \(got 0\)$"),
        (lambda: CenteredClipping(iterations=1.5), r"^strategy\.iterations must be an integer >= 1 \(got 1\.5\)$"),
        (lambda: CenteredClipping(iterations=True), r"^strategy\.iterations must be an integer >= 1 \(got True\)$"),
        (lambda: CenteredClipping(iterations="2"), r"^strategy\.iterations must be an integer >= 1 \(got '2'\)$"),
    ],
)
def test_bad_arguments_raise_one_line_naming_the_field(make: Callable[[], Strategy], message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        make()
    assert "\n" not in str(error.value)


def test_a_bad_value_from_the_command_line_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"strategy\.iterations"):
        build_server(compose(["strategy=centered_clipping", "strategy.iterations=0"]))


def test_the_option_composes_and_runs_two_rounds() -> None:
    cfg = compose(["strategy=centered_clipping", "num_rounds=2", "logger=quiet"])
    assert cfg.strategy.tau == 1.0 and cfg.strategy.iterations == 1
    server = build_server(cfg)
    history = server.run().history
    assert len(history) == 2 and all(0.0 <= row["strategy/clipped_fraction"] <= 1.0 for row in history)
    assert history[-1]["strategy/center_norm"] == pytest.approx(float(server.strategy.state_dict()["center"].norm()))


BASE = [
    "strategy=centered_clipping",
    "strategy.tau=0.05",
    "strategy.iterations=2",
    "clients_per_round=4",
    "logger.progress=false",
    "logger.tensorboard=false",
    "+data.max_size=60",
]


def test_a_resumed_run_is_bitwise_the_uninterrupted_one(tmp_path: Path) -> None:
    # tau small enough that updates are clipped, so the centre matters from round 2 on
    straight = run_config(compose([*BASE, "num_rounds=4"]), run_dir=tmp_path / "straight")
    assert max(row["strategy/clipped_fraction"] for row in straight.history) > 0
    run_config(compose([*BASE, "num_rounds=2"]), run_dir=tmp_path / "resumed")
    resumed = run_config(compose([*BASE, "num_rounds=4", "resume=true"]), run_dir=tmp_path / "resumed")
    assert torch.equal(resumed.params, straight.params)
    assert [r["strategy/center_norm"] for r in resumed.history] == [r["strategy/center_norm"] for r in straight.history]
