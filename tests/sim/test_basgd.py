"""BASGD (Yang and Li, ICML 2021) on FedBuff's asynchronous loop: the buffers and the robust step with
hand-computed numbers, a step that waits for every buffer, the same run under every executor, exact resume, and
what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedsim.cli.run import build_server, compose
from fedsim.strategy import BASGD, FedBuff

ROBUST = [
    "num_rounds=6",
    "logger=quiet",
    "eval_every=3",
    "clock=sampled",
    "strategy=basgd",
    "strategy.num_buffers=3",
    "strategy.concurrency=5",
]


def _sim(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "system/"))} for r in history]


def test_step_is_the_median_of_the_buffer_means() -> None:
    """Clients 0, 1, 2, 3, 5 fill buffers 0, 1, 2, 0, 2 (c mod 3): means b0 = (Δ0 + Δ3)/2, b1 = Δ1,
    b2 = (Δ2 + Δ5)/2; the step moves w by server_lr times their coordinate-wise median."""
    w = torch.tensor([1.0, 1.0])
    deltas = [
        torch.tensor([2.0, 0.0]),
        torch.tensor([100.0, -100.0]),
        torch.tensor([4.0, 1.0]),
        torch.tensor([0.0, 2.0]),
        torch.tensor([6.0, 3.0]),
    ]
    # b0 = [1, 1], b1 = [100, -100], b2 = [5, 2]: median [5, 1]; w + 0.5 * [5, 1] = [3.5, 1.5]
    strategy = BASGD(num_buffers=3, server_lr=0.5)
    assert torch.equal(strategy.step(w, deltas, [0] * 5, [0, 1, 2, 3, 5]), torch.tensor([3.5, 1.5]))
    # trimmed mean over 5 buffers with trim 0.2 drops the largest and smallest mean of each coordinate
    five = BASGD(num_buffers=5, rule="trimmed_mean", trim=0.2)
    ones = [torch.tensor([v]) for v in (1.0, 2.0, 3.0, 4.0, 1000.0)]
    assert torch.equal(five.step(torch.tensor([0.0]), ones, [0] * 5, [0, 1, 2, 3, 4]), torch.tensor([3.0]))
    # staleness weights apply before the means: s(3) = 1/2 with exponent 1/2
    weighted = BASGD(num_buffers=1, staleness_exponent=0.5)
    assert torch.equal(weighted.step(torch.tensor([0.0]), [torch.tensor([4.0])], [3], [7]), torch.tensor([2.0]))


def test_a_step_waits_until_every_buffer_holds_an_update() -> None:
    strategy = BASGD(num_buffers=3)
    assert not strategy.buffer_full([0, 3, 6, 1, 4])  # buffers 0 and 1 only
    assert strategy.buffer_full([0, 3, 1, 5])
    assert FedBuff(buffer_size=2).buffer_full([4, 4]) and not FedBuff(buffer_size=3).buffer_full([1, 2])


@pytest.fixture(scope="module")
def robust_reference():
    return build_server(compose(ROBUST)).run()


def test_every_server_step_covers_every_buffer(robust_reference) -> None:  # noqa: ANN001
    for row in robust_reference.history:
        assert row["client/num_aggregated"] >= 3
    server = build_server(compose(ROBUST))
    steps = []
    step = server.strategy.step
    server.strategy.step = lambda w, d, s, ids: (steps.append(list(ids)), step(w, d, s, ids))[1]
    server.run()
    assert len(steps) == 6 and all({c % 3 for c in ids} == {0, 1, 2} for ids in steps)
    assert any(len(ids) > 3 for ids in steps)  # a buffer's mean over more than one update


def test_process_workers_and_resume_give_the_serial_run(tmp_path: Path, robust_reference) -> None:  # noqa: ANN001
    result = build_server(compose([*ROBUST, "executor=process", "executor.devices=cpu", "executor.workers=3"])).run()
    assert _sim(result.history) == _sim(robust_reference.history) and torch.equal(
        result.params, robust_reference.params
    )
    settings = [*ROBUST, "logger.tensorboard=false"]
    build_server(compose([*settings, "num_rounds=3"]), run_dir=tmp_path / "cut").run()
    resumed = build_server(compose(settings), run_dir=tmp_path / "cut")
    assert resumed.resume(tmp_path / "cut").name == "round-000003.ckpt"
    result = resumed.run()
    assert _sim(result.history) == _sim(robust_reference.history) and torch.equal(
        result.params, robust_reference.params
    )


class NeverFull(FedBuff):
    def buffer_full(self, client_ids):  # noqa: ANN001, ANN201
        return False


def test_a_buffer_that_can_never_fill_stops_with_a_clear_error() -> None:
    """Once every client waits in the buffer, nothing can arrive any more: an error, not a hang."""
    server = build_server(
        compose(
            ["logger=quiet", "clock=sampled", "strategy=fedbuff", "strategy.buffer_size=3", "strategy.concurrency=5"]
        )
    )
    server.strategy.__class__ = NeverFull
    with pytest.raises(
        RuntimeError, match=r"every client waits in the buffer and none trains, but NeverFull.buffer_full"
    ):
        server.run()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["strategy.rule=mean"], r"strategy.rule must be one of median, trimmed_mean \(got 'mean'\)"),
        (["strategy.rule=trimmed_mean", "strategy.trim=0.5"], r"strategy.trim must be in \[0, 0.5\)"),
        (["strategy.num_buffers=26"], r"strategy.concurrency \+ strategy.num_buffers must be <= the 30 clients"),
        (["clock=none"], r"strategy: BASGD trains asynchronously on the simulated clock"),
    ],
)
def test_bad_settings_are_refused_in_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_server(compose([*ROBUST, *overrides]))
