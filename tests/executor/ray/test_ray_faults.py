"""Ray actors that die while starting, or keep dying: the run goes on, or stops with one line; it never hangs."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from ray import cloudpickle  # noqa: E402

from fedsim.client.base import Client  # noqa: E402
from fedsim.client.federation import make_clients  # noqa: E402
from fedsim.core.errors import WorkerStartupError  # noqa: E402
from fedsim.core.types import FitTask  # noqa: E402
from fedsim.executor import RayExecutor, SerialExecutor  # noqa: E402
from fedsim.executor.base import MAX_FAILED_STARTS, Workload  # noqa: E402
from fedsim.models import MLP2NN  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/executor: fault_clients, executor_runs
import fault_clients  # noqa: E402
from executor_runs import federation_data  # noqa: E402
from own_processes import live_tagged, new_tag, tagged_environment  # noqa: E402

cloudpickle.register_pickle_by_value(fault_clients)  # Ray workers do not share this test's sys.path
KILL_LOOP = Path(__file__).parents[3] / "experiments" / "faults" / "kill_loop.py"
TASKS = [FitTask(0, 1, 10), FitTask(1, 1, 11), FitTask(2, 1, 12)]


@pytest.mark.slow
def test_killing_a_ray_worker_every_second_never_hangs() -> None:
    """The kill loop of experiments/faults under Ray: three kills, one every half second, of an 8-round run (the
    kills land while its actors start and train, a run of 8 rounds lasts seconds after the third); runs before this
    module's Ray starts. The script's Ray (its daemons and workers carry the test's tag in their
    environment) leaves no process behind; any other Ray on the machine is none of this test's business."""
    tag = new_tag()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(KILL_LOOP),
            "--executor",
            "ray",
            "--repeats",
            "1",
            "--kills",
            "3",
            "--interval",
            "0.5",
            "--rounds",
            "8",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=tagged_environment(tag),
    )
    try:
        out, err = proc.communicate(timeout=300)  # a hang fails here
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    [line] = [json.loads(text) for text in out.splitlines() if text.startswith("{")]
    assert line["kills"] == 3, line
    assert line["outcome"] == "bitwise equal to serial" or line["outcome"].startswith("stopped with one line"), line
    deadline = time.monotonic() + 20
    while live_tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not live_tagged(tag), f"the script's Ray left processes behind: {live_tagged(tag)}"


def _fit(executor, factory) -> list:  # type: ignore[no-untyped-def]
    """Train ``TASKS`` from the same global weights with ``executor``, whose workers build their model with
    ``factory``."""
    data = federation_data()
    clients = make_clients(data, functools.partial(Client, epochs=1, batch_size=8))
    torch.manual_seed(0)
    params = torch.cat(
        [p.detach().flatten() for p in MLP2NN(input_shape=(60,), num_classes=10, hidden=32).parameters()]
    )
    with executor:
        executor.start(Workload(factory, clients, data.train))
        return executor.fit(params, TASKS)


@pytest.mark.slow
def test_actor_killed_while_starting_is_started_again(local_ray, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "starts"
    # one start killed, the second one ready (that a run stops only at MAX_FAILED_STARTS failed starts in a row:
    # test_actor_killed_at_every_start_stops_with_one_line)
    factory = functools.partial(fault_clients.mlp_that_kills_its_worker, str(marker), 1)
    results = _fit(RayExecutor(workers=1), factory)
    assert marker.read_text() == "2", "one start killed, the second one ready"
    reference = _fit(SerialExecutor(), functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=32))
    assert [torch.equal(a.params, b.params) for a, b in zip(results, reference, strict=True)] == [True] * len(TASKS)


@pytest.mark.slow
def test_actor_killed_at_every_start_stops_with_one_line(local_ray, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "starts"
    factory = functools.partial(fault_clients.mlp_that_kills_its_worker, str(marker), 1000)
    with pytest.raises(WorkerStartupError) as raised:
        _fit(RayExecutor(workers=1), factory)
    message = str(raised.value)
    assert "\n" not in message
    assert message == (
        "Ray worker r0 was killed or crashed (possibly out of memory; Ray does not say which signal) "
        f"before it could train ({MAX_FAILED_STARTS} failed starts in a row)"
    )
    assert marker.read_text() == str(MAX_FAILED_STARTS)


@pytest.mark.slow
def test_actor_whose_constructor_raises_stops_at_once(local_ray, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(WorkerStartupError) as raised:
        _fit(RayExecutor(workers=1), fault_clients.mlp_that_cannot_import)
    # not started again: a second start would add "(N failed starts in a row)"
    assert (
        str(raised.value)
        == "Ray worker r0 could not start: ModuleNotFoundError: No module named 'fedsim_no_such_module'"
    )
