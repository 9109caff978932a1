"""FedBuff with availability: tasks start only on online clients, a client whose window closes mid-task drops out
then (no update, not trained), free slots wait for a client to come online; the same run under every executor and
an exact resume with dropped tasks in flight."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedsim.cli.run import build_server, compose
from fedsim.sim.clock import online_until

# an 18 s availability period with windows of about a fifth of it: tasks of 0.1-10 s often outlast their window
AVAILABLE = [
    "num_rounds=6",
    "logger=quiet",
    "eval_every=3",
    "clock=sampled",
    "strategy=fedbuff",
    "strategy.buffer_size=3",
    "strategy.concurrency=5",
    "clock.always_online=false",
    "clock.period_h=0.005",
    "clock.online_fraction_mean=0.2",
]


def _sim(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "system/"))} for r in history]


def test_tasks_start_online_drop_out_when_their_window_closes_and_slots_wait() -> None:
    server = build_server(compose(AVAILABLE))
    loop, started, arrived = server.stages[0].loop, {}, []
    fill, received = loop._fill, loop._received

    def record_fill(srv, buffered):  # noqa: ANN001, ANN202
        fill(srv, buffered)
        started.update({t.seq: t for t in loop.in_flight})

    def record_arrival(srv, round_num, task, trained):  # noqa: ANN001, ANN202
        arrived.append(task.seq)
        return received(srv, round_num, task, trained)

    loop._fill, loop._received = record_fill, record_arrival
    history = server.run().history
    profiles = loop.clock.profiles
    for task in started.values():
        assert profiles.online_at(task.client_id, task.start_s)
        leaves = online_until(profiles, task.client_id, task.start_s)
        planned = loop.clock.timing(
            task.client_id,
            epochs=server.clients[task.client_id].epochs,
            num_train=server.clients[task.client_id].num_train,
            model_bytes=server.parts.comm.down_bytes,
            update_bytes=server.parts.comm.up_bytes,
        ).total_s
        if task.arrives:
            assert task.finish_s == task.start_s + planned and leaves >= task.finish_s
        else:
            assert task.finish_s == leaves < task.start_s + planned
    dropped = {t.seq for t in started.values() if not t.arrives and t.finish_s <= history[-1]["sim/time_s"]}
    assert not dropped & set(arrived)  # a client gone offline sends nothing, and was never trained
    assert sum(r["sim/dropped_offline"] for r in history) == len(dropped) > 0
    assert min(r["sim/in_flight"] for r in history) < 5  # slots waited for a client to come online
    assert all(r["client/num_aggregated"] == 3 for r in history)


@pytest.fixture(scope="module")
def available_reference():
    return build_server(compose(AVAILABLE)).run()


def test_process_workers_give_the_serial_run(available_reference) -> None:  # noqa: ANN001
    result = build_server(compose([*AVAILABLE, "executor=process", "executor.devices=cpu", "executor.workers=3"])).run()
    assert _sim(result.history) == _sim(available_reference.history)
    assert torch.equal(result.params, available_reference.params)


def test_resume_with_dropped_tasks_in_flight_continues_bitwise(tmp_path: Path, available_reference) -> None:  # noqa: ANN001
    settings = [*AVAILABLE, "logger.tensorboard=false"]
    build_server(compose([*settings, "num_rounds=3"]), run_dir=tmp_path / "cut").run()
    resumed = build_server(compose(settings), run_dir=tmp_path / "cut")
    assert resumed.resume(tmp_path / "cut").name == "round-000003.ckpt"
    result = resumed.run()
    assert _sim(result.history) == _sim(available_reference.history)
    assert torch.equal(result.params, available_reference.params)


def test_windows_that_close_to_float_rounding_do_not_stall_the_loop() -> None:
    """FedBuff's defaults (concurrency 20, buffer 10, 30 clients) with short windows: a first version started tasks
    on clients whose window had closed to float rounding, each ending at once, for ever. Now every step's events
    move the clock on and slots wait for a window to open."""
    result = build_server(
        compose(
            [
                "num_rounds=30",
                "logger=quiet",
                "eval_every=30",
                "clock=sampled",
                "strategy=fedbuff",
                "clock.always_online=false",
                "clock.period_h=0.005",
                "clock.online_fraction_mean=0.2",
            ]
        )
    ).run()
    times = [r["sim/time_s"] for r in result.history]
    assert len(times) == 30 and times == sorted(times) and all(r["client/num_aggregated"] == 10 for r in result.history)
    assert sum(r["sim/dropped_offline"] for r in result.history) > 0
