"""ProcessExecutor: same answers as the serial reference, faults handled, nothing left behind.

These tests start real spawned worker processes (a few seconds each), so they share small federations.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from builders import tiny_server

from fedsim.client.base import Client
from fedsim.client.federation import make_clients
from fedsim.core.params import flatten
from fedsim.core.types import ClientFailure, ClientUpdate, FitTask
from fedsim.executor import ProcessExecutor, SerialExecutor
from fedsim.executor.base import Workload
from fedsim.models import MLP2NN
from fedsim.observe.run_logger import RunLogger
from fedsim.server.server import RoundFailedError, Server

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/executor: fault_clients, executor_runs
import fault_clients  # noqa: E402  (workers import it by the same name: spawn copies sys.path)
from executor_runs import (  # noqa: E402
    PER_ROUND,
    assert_all_gone,
    federation_data,
    first_sampled_client,
    run,
    serial_reference,
    worker_pids,
)
from own_processes import live_tagged, new_tag, tagged_environment  # noqa: E402


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_bitwise_equal_to_serial(workers: int, tmp_path: Path) -> None:
    result = run(ProcessExecutor(devices="cpu", workers=workers), run_dir=tmp_path)
    assert torch.equal(result.params, serial_reference())
    used = {c["worker"] for r in result.history for c in r["clients"]}
    assert used <= {f"w{i}" for i in range(workers)} and {
        c["device"] for r in result.history for c in r["clients"]
    } == {"cpu"}
    if workers > 1:
        assert len(used) > 1, "tasks should spread over workers"
    assert_all_gone(worker_pids(tmp_path))


def test_dropout_is_the_same_in_every_worker_and_in_serial() -> None:
    """Dropout draws from torch's global RNG, which each task seeds from its own seed: the weights do not
    depend on which worker ran a task, after which other tasks, or on the parent's RNG."""

    def final(executor) -> torch.Tensor:  # type: ignore[no-untyped-def]
        torch.manual_seed(len(str(executor)))  # a different parent RNG state for every executor
        model = functools.partial(fault_clients.dropout_mlp, (60,), 10)
        client = functools.partial(Client, epochs=2, batch_size=8)
        return (
            tiny_server(
                federation_data(),
                model=model,
                client=client,
                executor=executor,
                num_rounds=2,
                seed=7,
                clients_per_round=PER_ROUND,
            )
            .run()
            .params
        )

    assert torch.equal(final(ProcessExecutor(devices="cpu", workers=3)), final(SerialExecutor()))


def test_integer_buffers_start_every_task_as_built() -> None:
    """BatchNorm with ``momentum=None`` averages over ``num_batches_tracked``, an integer buffer that is not
    federated. It must start every task at its built value; if it carried over from earlier tasks (or from a
    worker's warm-up step), the result would depend on which worker ran which clients."""

    def final(executor) -> torch.Tensor:  # type: ignore[no-untyped-def]
        model = functools.partial(fault_clients.cumulative_bn_mlp, (60,), 10)
        client = functools.partial(Client, epochs=2, batch_size=8)
        quiet = RunLogger(None, tensorboard=False, progress=False)
        return (
            tiny_server(
                federation_data(),
                model=model,
                client=client,
                executor=executor,
                num_rounds=2,
                clients_per_round=PER_ROUND,
                seed=7,
                logger=quiet,
            )
            .run()
            .params
        )

    assert torch.equal(final(ProcessExecutor(devices="cpu", workers=2)), final(SerialExecutor()))


def test_raising_client_is_reported_and_policy_applies(tmp_path: Path) -> None:
    with pytest.raises(RoundFailedError, match=r"client \d+ fails on purpose"):
        run(ProcessExecutor(devices="cpu", workers=2), fault_clients.RaisingClient, bad_ids=tuple(range(8)))
    result = run(
        ProcessExecutor(devices="cpu", workers=2),
        fault_clients.RaisingClient,
        run_dir=tmp_path,
        min_success_fraction=0.5,
        bad_ids=(1, 3, 5),
    )
    failed = sum(r["client/num_failed"] for r in result.history)
    assert failed >= 1
    assert all(c["client_id"] not in (1, 3, 5) for r in result.history for c in r["clients"])
    log = (tmp_path / "run.log").read_text() if (tmp_path / "run.log").exists() else ""
    worker_logs = "".join(p.read_text() for p in (tmp_path / "workers").glob("*.log"))
    assert "Traceback" in worker_logs and "fails on purpose" in worker_logs
    del log


def test_sigkilled_worker_is_replaced_and_result_unchanged(tmp_path: Path) -> None:
    marker = tmp_path / "killed"
    victim = first_sampled_client()
    result = run(
        ProcessExecutor(devices="cpu", workers=2),
        fault_clients.KillOnceClient,
        run_dir=tmp_path,
        victim=victim,
        marker=str(marker),
    )
    assert marker.exists(), "the victim never ran"
    assert torch.equal(result.params, serial_reference())
    pids = worker_pids(tmp_path)
    assert int(marker.read_text()) in pids and len(pids) == 3  # two workers + one replacement
    assert_all_gone(pids)


@pytest.mark.slow
def test_a_killed_forkserver_takes_its_workers_along_and_they_are_replaced(tmp_path: Path) -> None:
    """Workers are forked from the forkserver and die with it (Linux's parent-death signal: no worker may outlive
    the run, and the forkserver exits with it). Killed mid-run, it is restarted, the workers are replaced and
    retried with the same seeds: the results stay those of the serial executor."""
    from multiprocessing import forkserver

    executor = ProcessExecutor(devices="cpu", workers=2)
    data = federation_data()
    factory = functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=32)
    clients = make_clients(data, functools.partial(Client, epochs=1, batch_size=8))
    params = flatten(factory())
    tasks = [FitTask(0, 1, 10), FitTask(1, 1, 11), FitTask(2, 1, 12)]
    with executor:
        executor.start(Workload(factory, clients, data.train))
        first, workers = forkserver._forkserver._forkserver_pid, [w.process.pid for w in executor.workers]
        os.kill(first, signal.SIGKILL)
        _wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers))
        results = executor.fit(params, tasks)
        assert forkserver._forkserver._forkserver_pid not in (None, first)
        assert not {w.process.pid for w in executor.workers} & set(workers)
    with SerialExecutor() as serial:
        serial.start(Workload(factory, clients, data.train))
        reference = serial.fit(params, tasks)
    assert [torch.equal(a.params, b.params) for a, b in zip(results, reference, strict=True)] == [True, True, True]


def test_tasks_queued_behind_a_killed_worker_run_again_without_using_retries(tmp_path: Path) -> None:
    """One worker holds the task it trains and the next one; it dies on the first. With no retries
    allowed, the first fails, and the queued one (never started) still trains, equal to serial."""
    data = federation_data()
    model_factory = functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=32)
    tasks = [FitTask(client_id=i, round_num=1, seed=100 + i, config={}) for i in range(4)]
    global_params = flatten(model_factory())
    killing = make_clients(
        data,
        functools.partial(
            fault_clients.KillOnceClient, epochs=2, batch_size=8, victim=0, marker=str(tmp_path / "killed")
        ),
    )
    executor = ProcessExecutor(devices="cpu", workers=1, max_retries=0)
    executor.start(Workload(model_factory, killing, data.train, log_dir=tmp_path))
    try:
        results = executor.fit(global_params, tasks)
    finally:
        executor.close()
    serial = SerialExecutor()
    serial.start(
        Workload(model_factory, make_clients(data, functools.partial(Client, epochs=2, batch_size=8)), data.train)
    )
    expected = serial.fit(global_params, tasks)
    assert (tmp_path / "killed").exists()
    assert isinstance(results[0], ClientFailure) and "SIGKILL" in results[0].error
    for got, want in zip(results[1:], expected[1:], strict=True):
        assert isinstance(got, ClientUpdate) and torch.equal(got.params, want.params)


def test_sigkilled_worker_without_retries_says_possibly_out_of_memory(tmp_path: Path) -> None:
    executor = ProcessExecutor(devices="cpu", workers=1, max_retries=0)
    with pytest.raises(RoundFailedError, match=r"worker w0 was killed by SIGKILL \(possibly out of memory\)"):
        run(executor, fault_clients.KillOnceClient, victim=first_sampled_client(), marker=str(tmp_path / "killed"))


def test_hanging_client_is_timed_out_and_retried(tmp_path: Path) -> None:
    marker = tmp_path / "hung"
    victim = first_sampled_client()
    executor = ProcessExecutor(devices="cpu", workers=2, client_timeout_s=3)
    result = run(executor, fault_clients.HangClient, run_dir=tmp_path, victim=victim, marker=str(marker))
    assert marker.exists()
    assert torch.equal(result.params, serial_reference())
    assert_all_gone(worker_pids(tmp_path))


def test_client_that_always_hangs_fails_after_bounded_retries(tmp_path: Path) -> None:
    victim = first_sampled_client()
    executor = ProcessExecutor(devices="cpu", workers=1, client_timeout_s=1, max_retries=1)
    with pytest.raises(RoundFailedError, match="timed out"):
        run(
            executor, fault_clients.HangClient, run_dir=tmp_path, victim=victim, marker=str(tmp_path / "m"), always=True
        )
    assert_all_gone(worker_pids(tmp_path))


def test_worker_logs_are_tagged_and_prints_stay_off_the_console(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    run(ProcessExecutor(devices="cpu", workers=2), fault_clients.PrintingClient, run_dir=tmp_path)
    logs = "".join(p.read_text() for p in (tmp_path / "workers").glob("worker-*.log"))
    assert re.search(r"\[round 1 client \d+\] hello from client \d+", logs)
    assert re.search(r"\[round \d+ client \d+\] INFO trained", logs)
    assert "hello from client" not in capfd.readouterr().err


def _mlp_with(lock: threading.Lock) -> MLP2NN:
    return MLP2NN((60,), 10)


def test_unsendable_model_factory_fails_before_training() -> None:
    server = tiny_server(
        federation_data(),
        model=functools.partial(_mlp_with, threading.Lock()),
        executor=ProcessExecutor(devices="cpu", workers=1),
        num_rounds=1,
        clients_per_round=2,
    )
    with pytest.raises(
        TypeError,
        match=r"cannot send the model factory to worker processes \(TypeError: cannot pickle "
        r"'_thread.lock' object\); make it picklable",
    ):
        server.run()


def test_lambdas_and_local_classes_go_to_workers_by_value() -> None:
    """A lambda model factory and a client class defined inside a function cannot be imported by name; they
    travel by value, and the run equals the serial one bitwise."""

    class LocalClient(Client):
        def loss(self, model, x, y):  # type: ignore[no-untyped-def]
            return super().loss(model, x, y) * 1.0

    def build(executor) -> Server:  # type: ignore[no-untyped-def]
        return tiny_server(
            federation_data(),
            model=lambda: MLP2NN((60,), 10, hidden=32),
            client=functools.partial(LocalClient, epochs=1, batch_size=8),
            executor=executor,
            num_rounds=2,
            clients_per_round=3,
            seed=1,
            logger=RunLogger(None, tensorboard=False, progress=False),
        )

    assert torch.equal(
        build(ProcessExecutor(devices="cpu", workers=2)).run().params, build(SerialExecutor()).run().params
    )


SCRIPT = """
import functools
from fedsim import Client, FedAvg, Federation, Schedule, Server, federate, make_clients
from fedsim.data.partition import natural
from fedsim.data.synthetic import synthetic
from fedsim.executor import ProcessExecutor
from fedsim.models import LogisticRegression

class MyClient(Client):
    def loss(self, model, x, y):
        return super().loss(model, x, y) * 1.0

def main():
    data = federate(
        synthetic(num_devices=4, min_size=20, max_size=40, seed=1), natural, client_test_fraction=0.2, seed=0
    )
    server = Server(model_factory=functools.partial(LogisticRegression, (60,), 10),
                    federation=Federation(make_clients(data, MyClient), data.train, data.test), strategy=FedAvg(),
                    executor=ProcessExecutor(devices="cpu", workers=2),
                    schedule=Schedule(num_rounds=2, clients_per_round=2))
    print("accuracy", server.run().history[-1]["eval/accuracy"])
"""


@pytest.mark.slow
def test_client_class_defined_in_a_script_works(tmp_path: Path) -> None:
    script = tmp_path / "my_experiment.py"
    script.write_text(SCRIPT + '\nif __name__ == "__main__":\n    main()\n')
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "accuracy" in done.stdout


@pytest.mark.slow
def test_script_without_main_guard_gets_a_clear_message(tmp_path: Path) -> None:
    tag = new_tag()
    script = tmp_path / "unguarded.py"
    script.write_text(SCRIPT + "\nmain()\n")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=tagged_environment(tag)
    )
    assert done.returncode != 0
    assert 'if __name__ == "__main__":' in done.stderr
    assert done.stderr.count("fedsim: a worker process was started while your script was being imported") <= 2
    _wait_for(lambda: not live_tagged(tag), timeout=10)  # "no worker outlives the script" (only the script's own)


@pytest.mark.slow
def test_class_from_an_interactive_session_goes_by_value() -> None:
    """``python -c`` has no file a worker could import ``MyClient`` from: the class travels by value."""
    code = SCRIPT + "\nmain()\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "accuracy" in done.stdout


@pytest.mark.slow
def test_sigterm_stops_the_cli_and_leaves_no_worker(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "fedsim",
        "executor=process",
        "executor.devices=cpu",
        "executor.workers=2",
        "num_rounds=100000",
        "logger=quiet",
        f"hydra.run.dir={tmp_path}",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (tmp_path / "metrics.jsonl").exists() and (tmp_path / "metrics.jsonl").stat().st_size > 0)
        pids = worker_pids(tmp_path)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert_all_gone(pids)


def _wait_for(condition, timeout: float = 90.0) -> None:  # type: ignore[no-untyped-def]
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.2)


def test_no_shared_memory_files_left(tmp_path: Path) -> None:
    """torch names a shared-memory file torch_<pid of its creator>_...: only this process's and its workers' count
    (another program on the machine may be creating its own meanwhile)."""

    def ours(pids: set[int]) -> set[str]:
        names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
        return {name for name in names if name.startswith(tuple(f"torch_{pid}_" for pid in pids))}

    before = ours({os.getpid()})
    run(ProcessExecutor(devices="cpu", workers=2), run_dir=tmp_path)
    pids = {os.getpid(), *worker_pids(tmp_path)}
    assert len(pids) == 3, pids
    assert not ours(pids) - before, ours(pids) - before
