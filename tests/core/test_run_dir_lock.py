"""One run, one directory (fedsim/core/run_lock.py, fedsim/cli/dir_lock.py): a directory another process's run
holds is refused in one line naming the holder, before anything is written; the operating system drops the lock
when its holder dies (kill -9 leaves no stale lock); within a process the lock is shared. Real processes hold the
directories: a second ``python -m fedsim``, a helper that takes the lock as every run does, a run killed with
SIGKILL, sweeps under the basic and the submitit launchers, and the Python API (RunLogger, Server)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from builders import sgd, tiny_federation, tiny_server
from cli_runner import run_cli
from own_processes import live_tagged, new_tag, tagged_environment

from fedsim.client.base import Client
from fedsim.core.checkpoint import load_latest
from fedsim.core.run_lock import LOCK_NAME, RunDirectoryInUse, hold, is_held, read_holder
from fedsim.observe.run_logger import RunLogger
from fedsim.report import command as report
from fedsim.server.server import Server
from fedsim.server.settings import Checkpoints

MEASURED = ("time/", "system/")  # wall-clock and memory readings differ between any two runs
FAST = ["data.num_devices=10", "clients_per_round=3", "logger.progress=false"]
HOLD = (
    "import sys, time\n"
    "from fedsim.core.run_lock import hold\n"
    "lease = hold(sys.argv[1])\n"
    "print('held', flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def holder() -> Iterator[functools.partial[subprocess.Popen[str]]]:
    """Start a process that takes a directory's lock as a run does (and keeps it); every one started is killed."""
    tag, started = new_tag(), []

    def start(directory: Path) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(directory)],
            stdout=subprocess.PIPE,
            text=True,
            env=tagged_environment(tag),
        )
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        return proc

    yield functools.partial(start)
    for proc in started:
        proc.kill()
        proc.wait(timeout=30)
    assert not live_tagged(tag)


def _kill9(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


# --- the lock itself ------------------------------------------------------------------------------------------


def test_a_directory_held_by_another_process_is_refused_naming_the_holder(tmp_path: Path, holder) -> None:
    proc = holder(tmp_path)
    assert is_held(tmp_path)
    with pytest.raises(RunDirectoryInUse) as refused:
        hold(tmp_path)
    line = str(refused.value)
    assert "\n" not in line and str(tmp_path.resolve()) in line
    assert f"pid {proc.pid} on host {socket.gethostname()}, since " in line
    assert refused.value.holder == read_holder(tmp_path) and refused.value.holder.pid == proc.pid


def test_after_kill_9_of_the_holder_the_directory_is_free_at_once(tmp_path: Path, holder) -> None:
    _kill9(holder(tmp_path))
    assert (tmp_path / LOCK_NAME).exists() and read_holder(tmp_path).pid is not None  # left behind, but not held
    assert not is_held(tmp_path)
    with hold(tmp_path) as lease:
        assert read_holder(tmp_path).pid == os.getpid() and lease.directory == tmp_path.resolve()
    assert not (tmp_path / LOCK_NAME).exists()  # a run that ends removes it


def test_within_a_process_the_lock_is_shared_and_the_last_release_removes_it(tmp_path: Path) -> None:
    first, second = hold(tmp_path), hold(tmp_path / ".")
    first.release()
    first.release()  # twice: harmless
    assert (tmp_path / LOCK_NAME).exists() and is_held(tmp_path)
    second.release()
    assert not (tmp_path / LOCK_NAME).exists() and not is_held(tmp_path)


# --- the Python API -------------------------------------------------------------------------------------------


def _server(checkpoint_dir: Path, logger: RunLogger | None = None) -> Server:
    return tiny_server(
        tiny_federation(6, num_features=4, num_classes=3, max_size=30, seed=1),
        client=functools.partial(Client, epochs=1, batch_size=10, optimizer=sgd(0.1)),
        num_rounds=2,
        clients_per_round=3,
        logger=logger,
        checkpoints=Checkpoints(checkpoint_dir),
    )


def test_a_logger_or_a_server_on_a_held_directory_is_refused_before_writing(tmp_path: Path, holder) -> None:
    run_dir, checkpoints = tmp_path / "run", tmp_path / "ckpt"
    holder(run_dir)
    holder(checkpoints)
    with pytest.raises(RunDirectoryInUse, match="is in use by another run"):
        RunLogger(run_dir)
    with pytest.raises(RunDirectoryInUse, match="is in use by another run"):
        _server(checkpoints)
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_NAME]
    assert sorted(p.name for p in checkpoints.iterdir()) == [LOCK_NAME]


def test_a_server_holds_its_directories_until_its_run_ends(tmp_path: Path) -> None:
    server = _server(tmp_path / "ckpt", RunLogger(tmp_path / "run"))
    again = _server(tmp_path / "ckpt")  # the same process (a notebook cell run twice): shared, not refused
    assert is_held(tmp_path / "ckpt") and is_held(tmp_path / "run")
    server.run()
    assert not is_held(tmp_path / "run") and is_held(tmp_path / "ckpt")  # the second server still holds it
    again.run()
    assert not is_held(tmp_path / "ckpt") and not (tmp_path / "ckpt" / LOCK_NAME).exists()
    assert load_latest(tmp_path / "ckpt")[1]["round"] == 2


# --- the command line -----------------------------------------------------------------------------------------


def _one_line_naming(stderr: str, directory: Path, pid: int) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("fedsim: error: ") and "is in use by another run" in lines[0], lines[0]
    assert str(directory.resolve()) in lines[0] and f"pid {pid} on host" in lines[0], lines[0]


def _deterministic(run_dir: Path) -> dict:
    """What two runs of one configuration share bit for bit: every file but the wall-clock readings."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    summary.pop("wall_time_s")
    return {
        "metrics": [{k: v for k, v in r.items() if not k.startswith(MEASURED)} for r in records],
        "summary": summary,
        "hydra": {p.name: p.read_bytes() for p in sorted((run_dir / ".hydra").iterdir())},
        "params": load_latest(run_dir / "checkpoints")[1]["params"],
        "files": sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if "tensorboard" not in p.parts),
    }


def _same(a: dict, b: dict) -> None:
    assert a["metrics"] == b["metrics"] and a["summary"] == b["summary"] and a["hydra"] == b["hydra"]
    assert torch.equal(a["params"], b["params"]) and a["files"] == b["files"]


@pytest.mark.slow
def test_two_runs_started_together_on_one_directory(tmp_path: Path) -> None:
    """Exactly one runs; the other exits 2 with one line naming it; the directory equals a solo run's."""
    run_dir, tag = tmp_path / "run", new_tag()
    argv = [sys.executable, "-m", "fedsim", *FAST, "num_rounds=8", "checkpoint_every=1", f"hydra.run.dir={run_dir}"]
    procs = {
        seed: subprocess.Popen(
            [*argv, f"seed={seed}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=tagged_environment(tag),
        )
        for seed in (1, 2)
    }
    outputs = {seed: proc.communicate(timeout=300) for seed, proc in procs.items()}
    codes = {seed: proc.returncode for seed, proc in procs.items()}
    assert sorted(codes.values()) == [0, 2], (codes, outputs)
    winner, loser = (1, 2) if codes[1] == 0 else (2, 1)
    _one_line_naming(outputs[loser][1], run_dir, procs[winner].pid)
    assert not (run_dir / LOCK_NAME).exists()
    raced = tmp_path / "raced"
    run_dir.rename(raced)
    solo = run_cli([*argv[3:], f"seed={winner}"])
    assert solo.returncode == 0, solo.stderr
    _same(_deterministic(raced), _deterministic(run_dir))
    assert not live_tagged(tag)


def _wait_for_rounds(run_dir: Path, rounds: int, proc: subprocess.Popen[str], timeout: float = 120.0) -> None:
    deadline, path = time.monotonic() + timeout, run_dir / "metrics.jsonl"
    while not (path.exists() and len(path.read_text().splitlines()) >= rounds):
        assert proc.poll() is None, "the run ended before the test could act"
        assert time.monotonic() < deadline, "timed out waiting for rounds"
        time.sleep(0.05)


@pytest.fixture
def long_run(tmp_path: Path) -> Iterator[functools.partial[subprocess.Popen[str]]]:
    """Start a ``python -m fedsim`` run far longer than any test (stopped by the test or, at the end, killed)."""
    tag, started = new_tag(), []

    def start(run_dir: Path, *overrides: str) -> subprocess.Popen[str]:
        argv = [sys.executable, "-m", "fedsim", *FAST, "num_rounds=100000", "checkpoint_every=1"]
        proc = subprocess.Popen(
            [*argv, *overrides, f"hydra.run.dir={run_dir}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            env=tagged_environment(tag),
        )
        started.append(proc)
        return proc

    yield functools.partial(start)
    for proc in started:
        proc.kill()
        proc.wait(timeout=30)
    assert not live_tagged(tag)


@pytest.mark.slow
def test_a_resume_while_the_original_still_runs_is_refused_before_writing_and_after_its_kill_9_proceeds(
    tmp_path: Path, long_run
) -> None:
    """resume=true and resume=auto, each refused while the run goes on; once it is killed with SIGKILL (its lock
    file left behind), the resume proceeds at once: one run shows both, a fresh interpreter less."""
    run_dir = tmp_path / "run"
    proc = long_run(run_dir)
    _wait_for_rounds(run_dir, 3, proc)
    overrides = (run_dir / ".hydra" / "overrides.yaml").read_bytes()
    for resume in ("true", "auto"):
        done = run_cli([*FAST, "num_rounds=100000", f"resume={resume}", f"hydra.run.dir={run_dir}"])
        assert done.returncode == 2, (resume, done.stderr)
        _one_line_naming(done.stderr, run_dir, proc.pid)
        assert (run_dir / ".hydra" / "overrides.yaml").read_bytes() == overrides  # Hydra did not rewrite it either
        assert proc.poll() is None  # the original goes on
    _kill9(proc)
    assert read_holder(run_dir).pid == proc.pid  # the dead run's details stay in the file, its lock does not
    rounds = load_latest(run_dir / "checkpoints")[1]["round"] + 2  # the run went on while the resumes were refused
    done = run_cli([*FAST, f"num_rounds={rounds}", "resume=true", f"hydra.run.dir={run_dir}"])
    assert done.returncode == 0, done.stderr
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == rounds
    assert not (run_dir / LOCK_NAME).exists()


# --- sweeps ---------------------------------------------------------------------------------------------------


def test_a_second_sweep_into_a_held_sweep_directory_is_refused_before_any_job(tmp_path: Path, holder) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = holder(sweep_dir)
    done = run_cli(["-m", *FAST, "num_rounds=1", "seed=0,1", f"hydra.sweep.dir={sweep_dir}"])
    assert done.returncode == 2
    _one_line_naming(done.stderr, sweep_dir, proc.pid)
    assert sorted(p.name for p in sweep_dir.iterdir()) == [LOCK_NAME]  # no multirun.yaml, no job


def _job_refused(done: subprocess.CompletedProcess[str], sweep_dir: Path, pid: int) -> None:
    """Job 0 refused in one line (the sweep's exit 2), job 1 ran; nothing of fedsim's went into job 0's directory."""
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("fedsim: error:")]
    assert len(lines) == 1 and "a job of the sweep" in lines[0], done.stderr
    assert str((sweep_dir / "job0").resolve()) in lines[0] and f"pid {pid} on host" in lines[0], lines[0]
    assert json.loads((sweep_dir / "job1" / "summary.json").read_text())["finished"]
    fedsim_files = {"metrics.jsonl", "summary.json", "checkpoints", "tensorboard", "client_eval"}
    assert not fedsim_files & {p.name for p in (sweep_dir / "job0").iterdir()}


@pytest.mark.slow
def test_a_sweep_job_whose_directory_is_held_fails_alone(tmp_path: Path, holder) -> None:
    sweep_dir = tmp_path / "sweep"
    proc = holder(sweep_dir / "job0")
    args = [
        "-m",
        *FAST,
        "num_rounds=1",
        "seed=0,1",
        f"hydra.sweep.dir={sweep_dir}",
        "hydra.sweep.subdir=job${hydra:job.num}",
    ]
    _job_refused(run_cli(args), sweep_dir, proc.pid)


@pytest.mark.slow
def test_under_the_submitit_launcher_each_job_process_locks_its_directory(tmp_path: Path, holder) -> None:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the test extra installs it")
    sweep_dir = tmp_path / "sweep"
    proc = holder(sweep_dir / "job0")
    args = [
        "-m",
        *FAST,
        "num_rounds=1",
        "seed=0,1",
        "hydra/launcher=submitit_local",
        f"hydra.sweep.dir={sweep_dir}",
        "hydra.sweep.subdir=job${hydra:job.num}",
    ]
    _job_refused(run_cli(args), sweep_dir, proc.pid)  # the jobs run in submitit's own processes


# --- the report -----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_report_calls_a_run_that_holds_its_directory_running(tmp_path: Path, long_run, capsys) -> None:
    sweep = tmp_path / "sweep"
    done = run_cli([*FAST, "num_rounds=2", "seed=0", f"hydra.run.dir={sweep / 'done'}"])
    assert done.returncode == 0, done.stderr
    proc = long_run(sweep / "live", "seed=1")
    _wait_for_rounds(sweep / "live", 2, proc)
    with open(sweep / "live" / "metrics.jsonl", "a") as f:
        f.write('{"round": 99999, "train/lo')  # what a reader can catch while a record is being written
    assert report.main([str(sweep), "--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr()
    lines = (out.out + out.err).splitlines()
    assert any(line.startswith("running: live (") for line in lines), lines
    assert not any("damaged" in line or line.startswith("unfinished:") for line in lines), lines
    proc.send_signal(signal.SIGTERM)  # the run stops after its round and releases the directory
    assert proc.wait(timeout=120) == 130
    shutil.rmtree(tmp_path / "report")
    assert report.main([str(sweep), "--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr()
    assert not any(line.startswith("running:") for line in (out.out + out.err).splitlines())
