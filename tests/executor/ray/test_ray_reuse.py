"""RayExecutor(reuse_actors=True): the next run in the process loads its workload into the actors the last one kept.

Same answers as the serial executor with warm actors, a kept actor that died while it waited is replaced, and kept
actors never hold CPUs that a run needs: a run of another shape or without reuse kills them at its start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from fedsim.executor import RayExecutor  # noqa: E402
from fedsim.executor.ray import release_warm_actors  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/executor: fault_clients, executor_runs
from executor_runs import run, serial_reference, worker_pids  # noqa: E402

pytestmark = pytest.mark.slow  # starts Ray actors


@pytest.fixture(autouse=True)
def _on_local_ray(local_ray) -> None:  # type: ignore[no-untyped-def]
    """Every test here runs on the suite's local Ray (2 CPUs, tests/conftest.py). A test's first run may find actors
    kept by the test before it (cheaper) or none; each test holds either way."""


def _gone(pids: set[int], within_s: float = 20.0) -> bool:
    deadline = time.monotonic() + within_s
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_the_next_run_trains_on_the_same_actors_and_equals_serial(tmp_path: Path) -> None:
    first = run(RayExecutor(workers=2, reuse_actors=True), run_dir=tmp_path / "first")
    second = run(RayExecutor(workers=2, reuse_actors=True), run_dir=tmp_path / "second")
    assert torch.equal(first.params, serial_reference()) and torch.equal(second.params, serial_reference())
    kept = worker_pids(tmp_path / "first")
    assert len(kept) == 2 and worker_pids(tmp_path / "second") == kept
    # each run's actor logs hold that run's lines only (the first run's files were closed when the second loaded)
    for name in ("first", "second"):
        logs = "".join(f.read_text() for f in (tmp_path / name / "workers").glob("ray-worker-*.log"))
        assert logs.count(" ready on cpu ") == 2, logs


def test_a_kept_actor_that_died_while_it_waited_is_replaced(tmp_path: Path) -> None:
    run(RayExecutor(workers=2, reuse_actors=True), run_dir=tmp_path / "first")
    kept = sorted(worker_pids(tmp_path / "first"))
    os.kill(kept[0], signal.SIGKILL)
    assert _gone({kept[0]})
    second = run(RayExecutor(workers=2, reuse_actors=True), run_dir=tmp_path / "second")
    assert torch.equal(second.params, serial_reference())
    now = worker_pids(tmp_path / "second")
    assert kept[1] in now and kept[0] not in now and len(now) == 2


def test_a_run_without_reuse_kills_the_kept_actors_first(tmp_path: Path) -> None:
    run(RayExecutor(workers=2, reuse_actors=True), run_dir=tmp_path / "first")
    kept = worker_pids(tmp_path / "first")
    # the local Ray has 2 CPUs, both held by the kept actors: this run's actor could not start beside them
    fresh = run(RayExecutor(workers=1, start_timeout_s=60), run_dir=tmp_path / "fresh")
    assert torch.equal(fresh.params, serial_reference())
    assert not kept & worker_pids(tmp_path / "fresh") and _gone(kept)
    assert release_warm_actors() == 0, "a run without reuse keeps nothing"
    assert ray.is_initialized(), "an executor that joined Ray (and killed its actors) must not shut it down"


def test_kept_actors_of_another_shape_are_killed_not_left_holding_cpus(tmp_path: Path) -> None:
    # one kept actor holds one of the local Ray's 2 CPUs: the two-thread actor could not start beside it
    run(RayExecutor(workers=1, reuse_actors=True), run_dir=tmp_path / "one_thread")
    kept = worker_pids(tmp_path / "one_thread")
    run(RayExecutor(workers=1, threads=2, reuse_actors=True, start_timeout_s=60), run_dir=tmp_path / "two_threads")
    assert not kept & worker_pids(tmp_path / "two_threads") and _gone(kept)
    last = worker_pids(tmp_path / "two_threads")
    assert release_warm_actors() == 1 and _gone(last), "release_warm_actors kills what the last run kept"
    assert release_warm_actors() == 0


KEPT_RAY = """
import sys
sys.path[:0] = [{tests!r}, {suite!r}]
import ray
from fedsim.executor import RayExecutor
from fedsim.executor.ray import release_warm_actors
from executor_runs import run, serial_reference
import torch

first = run(RayExecutor(workers=1, reuse_actors=True))  # no Ray yet: this executor starts one, and keeps it
assert ray.is_initialized(), "a run that keeps its actors keeps the Ray they run on"
second = run(RayExecutor(workers=1, reuse_actors=True))
assert torch.equal(first.params, serial_reference()) and torch.equal(second.params, serial_reference())
assert release_warm_actors() == 1
ray.shutdown()
print("ok")
"""


def test_a_run_that_started_ray_and_keeps_its_actors_keeps_ray_up_for_the_next(tmp_path: Path) -> None:
    script = tmp_path / "kept_ray.py"
    script.write_text(KEPT_RAY.format(tests=str(Path(__file__).parents[1]), suite=str(Path(__file__).parents[2])))
    env = {**os.environ, "RAY_ADDRESS": "local"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
