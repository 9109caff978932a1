"""Workers started while the run is being built (ProcessExecutor.prepare, called by the Server once its settings are
checked): they build their model meanwhile and are the ones that train; a workload with another model gets fresh
ones; a run closed before it started leaves neither a worker process nor a log file."""

from __future__ import annotations

import functools
import gc
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedsim.client.base import Client
from fedsim.client.federation import make_clients
from fedsim.core.params import flatten
from fedsim.core.types import FitTask
from fedsim.executor import ProcessExecutor, SerialExecutor
from fedsim.executor.base import Workload
from fedsim.models import MLP2NN

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/executor: executor_runs
sys.path.insert(0, str(Path(__file__).parents[2]))  # tests: own_processes
from executor_runs import assert_all_gone, federation_data, run, serial_reference, worker_pids  # noqa: E402
from own_processes import live_tagged, new_tag, tagged_environment  # noqa: E402

BUILT_EARLY = "model built while the run was being built"


def _logs(run_dir: Path) -> str:
    return "".join(p.read_text() for p in sorted((run_dir / "workers").glob("worker-*.log")))


@pytest.mark.slow
def test_workers_build_their_model_while_the_server_is_built_and_train(tmp_path: Path) -> None:
    result = run(ProcessExecutor(devices="cpu", workers=2), run_dir=tmp_path)
    assert torch.equal(result.params, serial_reference())
    logs = _logs(tmp_path)
    assert logs.count(BUILT_EARLY) == 2, logs  # each worker once: the early ones trained, none was started again
    assert len(worker_pids(tmp_path)) == 2
    assert_all_gone(worker_pids(tmp_path))


@pytest.mark.slow
def test_a_workload_with_another_model_gets_fresh_workers(tmp_path: Path) -> None:
    data = federation_data()
    clients = make_clients(data, functools.partial(Client, epochs=1, batch_size=8))
    small = functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=16)
    large = functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=32)
    workload = Workload(large, clients, data.train, log_dir=tmp_path)
    init = flatten(large())
    tasks = [FitTask(client_id=c, round_num=1, seed=c) for c in (0, 1, 2)]
    executor = ProcessExecutor(devices="cpu", workers=2)
    executor.prepare(small, tmp_path)
    try:
        executor.start(workload)
        results = executor.fit(init, tasks)
    finally:
        executor.close()
    serial = SerialExecutor()
    serial.start(workload)
    expected = serial.fit(init, tasks)
    assert [torch.equal(a.params, b.params) for a, b in zip(results, expected, strict=True)] == [True] * 3
    assert BUILT_EARLY not in _logs(tmp_path) and len(worker_pids(tmp_path)) == 2


@pytest.mark.slow
def test_closing_a_prepared_executor_leaves_no_worker_and_no_log(tmp_path: Path) -> None:
    executor = ProcessExecutor(devices="cpu", workers=2)
    server = _forkserver()
    before = _live_children(server)  # another test's workers in this process, if any: not ours to judge
    executor.prepare(functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=16), tmp_path)
    deadline = time.monotonic() + 120  # the forkserver may still be importing torch
    while len(_live_children(server) - before) < 2:
        assert time.monotonic() < deadline, "the early workers were never forked"
        time.sleep(0.05)
    ours = _live_children(server) - before
    executor.close()
    _wait_until_gone(server, ours)
    assert not (tmp_path / "workers").exists()


@pytest.mark.slow
def test_a_prepared_executor_dropped_unstarted_kills_its_workers(tmp_path: Path) -> None:
    """A server built and never run: once its executor is collected, the early workers' pipes are closed and they
    exit (a worker that reads the end of its pipe returns)."""
    executor = ProcessExecutor(devices="cpu", workers=2)
    server = _forkserver()
    before = _live_children(server)
    executor.prepare(functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=16), tmp_path)
    deadline = time.monotonic() + 120
    while len(_live_children(server) - before) < 2:
        assert time.monotonic() < deadline, "the early workers were never forked"
        time.sleep(0.05)
    ours = _live_children(server) - before
    del executor
    gc.collect()
    _wait_until_gone(server, ours)


def _wait_until_gone(server: int, pids: set[int]) -> None:
    deadline = time.monotonic() + 10  # a killed process is reaped by the forkserver
    while _live_children(server) & pids:
        assert time.monotonic() < deadline, _live_children(server) & pids
        time.sleep(0.05)


@pytest.mark.slow
def test_a_run_refused_after_its_workers_started_leaves_one_line_and_no_process(tmp_path: Path) -> None:
    """strategy=fedsa_lora refuses the default model in the Server's strategy.setup, after prepare() started the
    workers: the command prints its one line, exits 2, and leaves no process of its own (forkserver, workers) and no
    worker log. A fresh interpreter: what outlives the process is the subject."""
    tag, run_dir = new_tag(), tmp_path / "run"
    args = ["executor=process", "strategy=fedsa_lora", "num_rounds=1", f"hydra.run.dir={run_dir}"]
    done = subprocess.run(
        [sys.executable, "-m", "fedsim", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=tagged_environment(tag),
    )
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.startswith("fedsim: error: strategy=fedsa_lora needs a model with LoRA adapters")
    assert done.stderr.count("\n") == 1, done.stderr
    deadline = time.monotonic() + 10  # a worker forked as the process exited sees its pipe close and returns
    while live_tagged(tag):
        assert time.monotonic() < deadline, live_tagged(tag)
        time.sleep(0.1)
    assert not (run_dir / "workers").exists()


def _forkserver() -> int:
    """This test process's forkserver (started by ProcessExecutor): its children are this process's workers."""
    [pid] = [p for p in _live_children(os.getpid()) if b"forkserver" in Path(f"/proc/{p}/cmdline").read_bytes()]
    return pid


def _live_children(parent: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            found.add(int(entry))
    return found
