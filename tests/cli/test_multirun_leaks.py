"""Repeated runs inside one process (Hydra multirun, jobs one after another in the launcher process) leak
neither file descriptors, worker processes, fedsim objects nor signal handlers.

Each sweep is a real ``python -m fedsim -m seed=...`` with a Hydra callback (tests/multirun_probe.py) that
samples the launcher after every job. RSS is measured in experiments/multirun_memory, not asserted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240
SWEEPS = {
    "serial": (3, ["executor=serial"]),
    "process": (3, ["executor=process", "executor.devices=cpu", "executor.workers=2"]),
}


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Both sweeps side by side; one probe record per job of each."""
    root = tmp_path_factory.mktemp("multirun")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    env.pop("HYDRA_FULL_ERROR", None)
    procs = {}
    for name, (jobs, overrides) in SWEEPS.items():
        cmd = [
            sys.executable,
            "-m",
            "fedsim",
            "-m",
            f"seed=range(0,{jobs})",
            "num_rounds=1",
            "data.num_devices=10",
            "clients_per_round=4",
            "logger.progress=false",
            *overrides,
            f"hydra.sweep.dir={root / name}",
            "+hydra.callbacks.probe._target_=multirun_probe.Probe",
            f"+hydra.callbacks.probe.out={root / name}.jsonl",
        ]
        procs[name] = subprocess.Popen(
            cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    for proc in procs.values():
        output = proc.communicate(timeout=TIMEOUT_S)[0]
        assert proc.returncode == 0, output[-3000:]
    return {name: [json.loads(line) for line in (root / f"{name}.jsonl").read_text().splitlines()] for name in SWEEPS}


@pytest.mark.slow
@pytest.mark.parametrize("executor", list(SWEEPS))
def test_every_job_completes_and_leaves_no_fedsim_object_alive(
    samples: dict[str, list[dict[str, Any]]], executor: str
) -> None:
    records = samples[executor]
    assert len(records) == SWEEPS[executor][0] and all(r["status"] == "JobStatus.COMPLETED" for r in records)
    for job, record in enumerate(records):
        assert all(n == 0 for n in record["live"].values()), f"job {job}: {record['live']}"
        assert record["sigint"] == record["sigint_before"], f"job {job}: SIGINT still goes to {record['sigint']}"


@pytest.mark.slow
@pytest.mark.parametrize("executor", list(SWEEPS))
def test_open_fds_are_back_to_the_same_count_after_every_job(
    samples: dict[str, list[dict[str, Any]]], executor: str
) -> None:
    fds = [r["fds"] for r in samples[executor]]
    assert fds == [fds[0]] * len(fds), f"open fds after each job: {fds}"


@pytest.mark.slow
@pytest.mark.parametrize("executor", list(SWEEPS))
def test_no_worker_process_outlives_its_job(samples: dict[str, list[dict[str, Any]]], executor: str) -> None:
    forkservers = set()
    for job, record in enumerate(samples[executor]):
        # multiprocessing's resource tracker and the workers' forkserver are started once per process and stay,
        # so that later jobs get warm workers (fedsim/executor/process/forkserver.py): not workers
        workers = [
            cmd
            for cmd in record["children"]
            if "multiprocessing.resource_tracker" not in cmd and "multiprocessing.forkserver" not in cmd
        ]
        assert workers == [], f"job {job}: children still running: {workers}"
        # the workers themselves are the forkserver's children
        assert record["grandchildren"] == [], f"job {job}: workers still running: {record['grandchildren']}"
        forkservers.update(cmd for cmd in record["children"] if "multiprocessing.forkserver" in cmd)
    assert len(forkservers) <= 1, f"one forkserver for the whole sweep: {forkservers}"
