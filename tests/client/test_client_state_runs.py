"""Client state through whole runs: one semantics on every executor, commit on accept only, retries see the
same state, and ``self`` is never a place for state."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import stateful_clients  # noqa: E402
from builders import tiny_server  # noqa: E402

from fedsim.client.base import Client  # noqa: E402
from fedsim.executor import ProcessExecutor, RayExecutor, SerialExecutor, VmapExecutor, VmapUnsupportedError  # noqa: E402
from fedsim.observe.run_logger import RunLogger  # noqa: E402
from fedsim.server.server import ClientMisuseError, RunResult, Server  # noqa: E402
from fedsim.strategy import FedPer  # noqa: E402

ROUNDS = 8


def build(
    executor, client_cls=stateful_clients.CountingClient, strategy=None, rounds: int = ROUNDS, **client_kwargs
) -> Server:  # type: ignore[no-untyped-def]
    return tiny_server(
        client=functools.partial(client_cls, epochs=1, batch_size=8, **client_kwargs),
        strategy=strategy,
        executor=executor,
        num_rounds=rounds,
        clients_per_round=3,
        seed=11,
        logger=RunLogger(None, tensorboard=False, progress=False),
    )


def rows(result: RunResult) -> list[list[tuple[int, dict]]]:
    return [[(c["client_id"], c.get("metrics", {})) for c in r["clients"]] for r in result.history]


def scalars(result: RunResult) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k != "clients" and not k.startswith(("time/", "system/"))}
        for r in result.history
    ]


@pytest.fixture(scope="module")
def serial_counts() -> RunResult:
    return build(SerialExecutor()).run()


def test_the_counter_counts_accepted_rounds(serial_counts: RunResult) -> None:
    seen: dict[int, int] = {}
    for record in serial_counts.history:
        for client_id, metrics in [(c["client_id"], c["metrics"]) for c in record["clients"]]:
            seen[client_id] = seen.get(client_id, 0) + 1
            assert metrics["rounds_trained"] == seen[client_id]
    assert max(seen.values()) >= 3, "some client must train several times for the test to mean anything"


@pytest.mark.parametrize("workers", [1, 3])
def test_process_workers_give_the_serial_counts_bitwise(workers: int, serial_counts: RunResult) -> None:
    result = build(ProcessExecutor(devices="cpu", workers=workers)).run()
    assert rows(result) == rows(serial_counts)
    assert scalars(result) == scalars(serial_counts)
    assert torch.equal(result.params, serial_counts.params)


@pytest.mark.slow
def test_ray_gives_the_serial_counts_bitwise(serial_counts: RunResult, local_ray) -> None:  # type: ignore[no-untyped-def]
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(stateful_clients)  # Ray workers do not share this test's sys.path
    result = build(RayExecutor(workers=2, reuse_actors=True)).run()
    with pytest.raises(ClientMisuseError, match=r"SelfCountingClient changed self\.count"):
        build(RayExecutor(workers=2, reuse_actors=True), stateful_clients.SelfCountingClient, rounds=2).run()
    assert rows(result) == rows(serial_counts)
    assert torch.equal(result.params, serial_counts.params)


@pytest.mark.parametrize("executor", ["serial", "process"])
def test_a_counter_on_self_is_one_clear_error(executor: str) -> None:
    chosen = SerialExecutor() if executor == "serial" else ProcessExecutor(devices="cpu", workers=2)
    server = build(chosen, stateful_clients.SelfCountingClient, rounds=2)
    with pytest.raises(ClientMisuseError) as caught:
        server.run()
    message = str(caught.value)
    assert "SelfCountingClient changed self.count" in message and "client state" in message
    assert len(message.splitlines()) == 1


def test_a_state_a_checkpoint_cannot_hold_is_refused_naming_the_entry() -> None:
    with pytest.raises(ClientMisuseError, match=r"state\['optimizer'\] is a object"):
        build(SerialExecutor(), stateful_clients.BadStateClient, rounds=1).run()


def test_a_rejected_update_leaves_the_state_as_it_was(serial_counts: RunResult) -> None:
    bad_round = 4
    bad = serial_counts.history[bad_round - 1]["clients"][0]["client_id"]
    result = build(SerialExecutor(), stateful_clients.NaNForClientClient, bad=bad, bad_round=bad_round).run()
    counts = [
        (r["round"], c["metrics"]["rounds_trained"])
        for r in result.history
        for c in r["clients"]
        if c["client_id"] == bad
    ]
    expected = [
        (r["round"], c["metrics"]["rounds_trained"])
        for r in serial_counts.history
        for c in r["clients"]
        if c["client_id"] == bad
    ]
    before = [n for rnd, n in expected if rnd < bad_round]
    after = [(rnd, n - 1) for rnd, n in expected if rnd > bad_round]  # one accepted round fewer
    assert [n for rnd, n in counts if rnd < bad_round] == before
    assert [(rnd, n) for rnd, n in counts if rnd > bad_round] == after and after, "the client must train again later"


def test_a_killed_workers_retry_sees_the_state_of_the_first_attempt(tmp_path: Path, serial_counts: RunResult) -> None:
    victim = serial_counts.history[2]["clients"][0]["client_id"]
    marker = tmp_path / "killed"
    executor = ProcessExecutor(devices="cpu", workers=2, max_retries=1)
    result = build(executor, stateful_clients.KillOnceCountingClient, victim=victim, marker=str(marker)).run()
    assert marker.exists(), "the worker must have been killed mid-task"
    assert rows(result) == rows(serial_counts)  # the retry started from the committed count, not from 999
    assert torch.equal(result.params, serial_counts.params)


def test_vmap_refuses_a_client_half_that_keeps_state_at_start_up() -> None:
    with pytest.raises(VmapUnsupportedError, match="PersonalLayers.*keeps client state"):
        build(VmapExecutor(), Client, strategy=FedPer(personal_layers="bias"), rounds=1).run()


def test_fedper_refuses_a_pattern_that_leaves_nothing_federated_before_any_work() -> None:
    with pytest.raises(ValueError, match="personal_layers=None matches every entry"):  # logistic regression: one layer
        build(SerialExecutor(), Client, strategy=FedPer(), rounds=1)
    with pytest.raises(ValueError, match="personal_layers='head' matches no entry of the model"):
        build(SerialExecutor(), Client, strategy=FedPer(personal_layers="head"), rounds=1)


def test_declared_task_attributes_are_allowed_and_put_back_under_every_executor() -> None:
    serial_server = build(SerialExecutor(), stateful_clients.AnchoredClient, rounds=3)
    serial = serial_server.run()
    assert all(c._anchor is None for c in serial_server.clients), "the serial executor's clients are put back too"
    process = build(ProcessExecutor(devices="cpu", workers=2), stateful_clients.AnchoredClient, rounds=3).run()
    assert torch.equal(serial.params, process.params)
    plain = build(SerialExecutor(), Client, rounds=3).run()
    assert not torch.equal(serial.params, plain.params), "the anchor must matter"
