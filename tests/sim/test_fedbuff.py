"""FedBuff on the simulated clock: the server step's rule with hand-computed numbers, the event loop's invariants,
the same metrics and times under every executor, and the clear refusals."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fedsim.cli.run import build_server, compose
from fedsim.strategy import FedBuff

BUFFERED = [
    "num_rounds=6",
    "logger=quiet",
    "eval_every=3",
    "clock=sampled",
    "strategy=fedbuff",
    "strategy.buffer_size=3",
    "strategy.concurrency=5",
]


def test_server_step_is_the_staleness_weighted_mean_of_the_buffer() -> None:
    strategy = FedBuff(buffer_size=2, server_lr=0.5)
    w = torch.tensor([1.0, 2.0])
    deltas = [torch.tensor([2.0, 0.0]), torch.tensor([0.0, 3.0])]
    # s(0) = 1, s(3) = 1/2: w + 0.5 * ([2, 0] * 1 + [0, 3] * 0.5) / 2 = [1.5, 2.375]
    assert torch.equal(strategy.step(w, deltas, [0, 3]), torch.tensor([1.5, 2.375]))
    assert FedBuff(staleness_exponent=0.0).staleness_weight(99) == 1.0  # no staleness weighting
    with pytest.raises(ValueError, match=r"strategy.buffer_size and strategy.concurrency must be >= 1"):
        FedBuff(buffer_size=0)


def test_events_come_in_finish_order_and_staleness_counts_the_steps_in_between() -> None:
    server = build_server(compose(BUFFERED))
    loop, events = server.stages[0].loop, []
    received = loop._received

    def record(srv, round_num, task, trained):  # noqa: ANN001, ANN202
        events.append((round_num, loop.version, task, loop.clock.now_s, len(loop.in_flight)))
        return received(srv, round_num, task, trained)

    loop._received = record
    history = server.run().history
    finishes = [task.finish_s for _, _, task, _, _ in events]
    assert finishes == sorted(finishes) and all(now == task.finish_s for _, _, task, now, _ in events)
    assert all(in_flight == 4 for *_, in_flight in events)  # concurrency 5, the finished one just removed
    for round_num, metrics in enumerate(history, start=1):
        mine = [(version, task) for r, version, task, _, _ in events if r == round_num]
        taus = [version - task.version for version, task in mine]
        assert len(mine) == 3 and metrics["sim/time_s"] == mine[-1][1].finish_s
        assert metrics["sim/staleness_max"] == max(taus) and metrics["sim/staleness_mean"] == pytest.approx(
            sum(taus) / 3
        )
    assert any(r["sim/staleness_max"] > 0 for r in history)  # updates did arrive stale
    assert len(loop.in_flight) == 5 and len({t.client_id for t in loop.in_flight}) == 5


@pytest.fixture(scope="module")
def buffered_reference():
    return build_server(compose(BUFFERED)).run()


def _sim(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "system/"))} for r in history]


# three workers for more clients than that: one worker trains several clients in turn (all that a single
# worker would show) while the others' results arrive in any order
def test_process_workers_give_the_serial_metrics_and_times(buffered_reference) -> None:  # noqa: ANN001
    result = build_server(compose([*BUFFERED, "executor=process", "executor.devices=cpu", "executor.workers=3"])).run()
    assert _sim(result.history) == _sim(buffered_reference.history)
    assert torch.equal(result.params, buffered_reference.params)


def test_buffer_of_one_is_asynchronous_fedavg_one_step_per_update() -> None:
    result = build_server(compose([*BUFFERED, "strategy.buffer_size=1"])).run()
    assert all(r["client/num_aggregated"] == 1 for r in result.history)
    times = [r["sim/time_s"] for r in result.history]
    assert times == sorted(times)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["clock=none"], r"strategy: FedBuff trains asynchronously on the simulated clock: add clock=sampled"),
        (["clock.deadline_s=5"], r"clock.deadline_s and clock.over_selection are for synchronous rounds"),
        (
            ["strategy.concurrency=25", "strategy.buffer_size=10"],
            r"concurrency \+ strategy.buffer_size must be <= the 30 clients",
        ),
    ],
)
def test_what_the_asynchronous_loop_cannot_run_is_refused_in_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_server(compose([*BUFFERED, *overrides]))


def test_vmap_resume_from_a_checkpoint_continues_bitwise(tmp_path) -> None:  # noqa: ANN001
    """The event loop's state (clock, in-flight tasks, buffer) survives a checkpoint under executor=vmap too."""
    vmap = [*BUFFERED, "executor=vmap", "logger.tensorboard=false"]
    whole = build_server(compose(vmap), run_dir=tmp_path / "whole").run()
    cut = build_server(compose([*vmap, "num_rounds=3"]), run_dir=tmp_path / "cut").run()  # round 3 evaluates in both
    resumed = build_server(compose(vmap), run_dir=tmp_path / "cut")
    assert resumed.resume(tmp_path / "cut").name == "round-000003.ckpt"
    assert torch.equal(resumed.params, cut.params) and not torch.equal(cut.params, whole.params)
    result = resumed.run()
    assert _sim(result.history) == _sim(whole.history)
    assert torch.equal(result.params, whole.params)


# top-k with error feedback up (the residual is client state, committed with the server step that consumes the
# update), stochastic 4-bit QSGD down (seeded by the model version every client of it receives)
COMPRESSED = [
    *BUFFERED,
    "compression=topk",
    "compression.uplink=[{name: topk, fraction: 0.1}]",
    "compression.downlink=[{name: qsgd, bits: 4}]",
]


@pytest.fixture(scope="module")
def compressed_reference():
    return build_server(compose(COMPRESSED)).run()


def test_compressed_updates_are_what_the_server_consumes(compressed_reference) -> None:  # noqa: ANN001
    """Each consumed update moved the version it started from by a decoded top-10 % delta (plus the residual the
    client carried), and the bytes are the encodings'; the run is not the uncompressed one."""
    server = build_server(compose(COMPRESSED))
    loop, moved = server.stages[0].loop, []
    received = loop._received

    def record(srv, round_num, task, trained):  # noqa: ANN001, ANN202
        update = received(srv, round_num, task, trained)
        if update is not None:
            moved.append(int((update.params - loop.start_params[task.version]).ne(0).sum()))
        return update

    loop._received = record
    history = server.run().history
    n = server.params.numel()
    # (start + d) - start is exactly 0 where the decoded d is 0, so at most top-k's kept values move
    assert moved and max(moved) <= server.parts.comm.compression.uplink.sparsifiers[0].kept(n) == math.ceil(0.1 * n)
    assert (
        server.parts.comm.up_bytes <= 0.2 * 4 * n and server.parts.comm.down_bytes < 0.2 * 4 * n
    )  # 10 % and positions; 4 bits
    assert (
        history[-1]["comm/bytes_up_total"]
        == sum(r["client/num_aggregated"] for r in history) * server.parts.comm.up_bytes
    )
    assert _sim(history) == _sim(compressed_reference.history)  # the same run again: seeded, not drawn anew
    plain = build_server(compose(BUFFERED)).run()
    assert not torch.equal(compressed_reference.params, plain.params)


def test_compressed_process_workers_give_the_serial_run(compressed_reference) -> None:  # noqa: ANN001
    result = build_server(
        compose([*COMPRESSED, "executor=process", "executor.devices=cpu", "executor.workers=3"])
    ).run()
    assert _sim(result.history) == _sim(compressed_reference.history)
    assert torch.equal(result.params, compressed_reference.params)


def test_compressed_resume_continues_bitwise_with_the_residuals(tmp_path, compressed_reference) -> None:  # noqa: ANN001
    compressed = [*COMPRESSED, "logger.tensorboard=false"]
    build_server(compose([*compressed, "num_rounds=3"]), run_dir=tmp_path / "cut").run()
    resumed = build_server(compose(compressed), run_dir=tmp_path / "cut")
    assert resumed.resume(tmp_path / "cut").name == "round-000003.ckpt"
    assert any("fedsim.comm.residual" in resumed.parts.client_states.get(c) for c in range(len(resumed.clients)))
    result = resumed.run()
    assert _sim(result.history) == _sim(compressed_reference.history)
    assert torch.equal(result.params, compressed_reference.params)


def test_client_rows_measure_each_update_from_the_version_it_started_from(tmp_path) -> None:  # noqa: ANN001
    """A stale update's ``update_norm`` is its distance from its own start weights, not from the current model."""
    server = build_server(compose([*BUFFERED, "logger=default", "logger.tensorboard=false"]), run_dir=tmp_path)
    loop, norms = server.stages[0].loop, {}
    received = loop._received

    def record(srv, round_num, task, trained):  # noqa: ANN001, ANN202
        update = received(srv, round_num, task, trained)
        if update is not None:
            norms[round_num, task.client_id] = float(
                torch.linalg.vector_norm(update.params - loop.start_params[task.version])
            )
        return update

    loop._received = record
    history = server.run().history
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {(r["round"], c["client_id"]): c["update_norm"] for r in rows for c in r["clients"]} == norms
    assert any(r["sim/staleness_max"] > 0 for r in history)  # some were measured from an older version


class ReportingFedBuff(FedBuff):
    """FedBuff that reports the staleness weights s(τ) it applied: their mean as a scalar, each client's in its row."""

    def step(self, global_params, deltas, staleness, client_ids=()):  # noqa: ANN001, ANN201
        weights = [self.staleness_weight(tau) for tau in staleness]
        self.mean, self.weights = sum(weights) / len(weights), dict(zip(client_ids, weights, strict=True))
        return super().step(global_params, deltas, staleness, client_ids)

    def round_metrics(self, round_num: int) -> dict[str, float]:
        return {"staleness_weight_mean": self.mean}

    def client_metrics(self, round_num: int) -> dict[int, dict[str, float]]:
        return {client_id: {"staleness_weight": weight} for client_id, weight in self.weights.items()}


REPORTING = [*BUFFERED, "logger=default", "logger.progress=false", "strategy._target_=test_fedbuff.ReportingFedBuff"]


def test_an_asynchronous_strategys_own_metrics_are_logged_like_a_synchronous_ones(tmp_path) -> None:  # noqa: ANN001
    history = build_server(compose(REPORTING), run_dir=tmp_path / "serial").run().history
    records = [json.loads(line) for line in (tmp_path / "serial" / "metrics.jsonl").read_text().splitlines()]
    for metrics, record in zip(history, records, strict=True):
        # s(τ) = (1 + τ)^-1/2 of each consumed update; its mean is the step's scalar
        taus_mean, taus_max = metrics["sim/staleness_mean"], metrics["sim/staleness_max"]
        weights = [row["strategy"]["staleness_weight"] for row in record["clients"]]
        assert len(weights) == 3 and min(weights) == pytest.approx((1 + taus_max) ** -0.5)
        assert record["strategy/staleness_weight_mean"] == pytest.approx(sum(weights) / 3)
        assert (taus_mean == 0) == (record["strategy/staleness_weight_mean"] == 1.0)
    assert any(r["strategy/staleness_weight_mean"] < 1 for r in records)
    process = (
        build_server(
            compose([*REPORTING, "executor=process", "executor.devices=cpu", "executor.workers=2"]),
            run_dir=tmp_path / "process",
        )
        .run()
        .history
    )
    assert [r["strategy/staleness_weight_mean"] for r in process] == [
        r["strategy/staleness_weight_mean"] for r in history
    ]
