"""Checkpoints: atomic, verified, tamper-proof; a killed run resumes to exactly the uninterrupted result."""

from __future__ import annotations

import io
import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from builders import tiny_server
from cli_runner import run_cli

from fedsim.core.checkpoint import (
    MAGIC,
    CheckpointError,
    list_checkpoints,
    load_checkpoint,
    load_latest,
    save_checkpoint,
)
from fedsim.server.settings import Checkpoints

MEASURED = ("time/", "system/")  # wall-clock and memory readings differ between any two runs


def test_round_trip_keeps_the_newest_and_leaves_no_temporaries(tmp_path: Path) -> None:
    for r in range(1, 6):
        save_checkpoint(
            tmp_path, r, {"round": r, "params": torch.full((3,), float(r)), "history": [{"a": 1.0, "b": None}]}, keep=2
        )
    assert [p.name for p in tmp_path.iterdir()] and sorted(p.name for p in tmp_path.iterdir()) == [
        "round-000004.ckpt",
        "round-000005.ckpt",
    ]
    path, state = load_latest(tmp_path)
    assert path.name == "round-000005.ckpt" and torch.equal(state["params"], torch.full((3,), 5.0))
    assert state["history"] == [{"a": 1.0, "b": None}]


def test_a_truncated_latest_checkpoint_falls_back_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for r in (1, 2):
        save_checkpoint(tmp_path, r, {"round": r})
    latest = list_checkpoints(tmp_path)[-1]
    latest.write_bytes(latest.read_bytes()[:-7])
    with caplog.at_level(logging.WARNING, logger="fedsim"):
        path, state = load_latest(tmp_path)
    assert state["round"] == 1 and "corrupt" in caplog.text


class Payload:
    """An arbitrary object: a checkpoint holding one must never be unpickled."""


def test_a_tampered_checkpoint_is_refused(tmp_path: Path) -> None:
    import hashlib

    body = io.BytesIO()
    torch.save({"round": 1, "evil": Payload()}, body)
    data = body.getvalue()
    forged = tmp_path / "round-000001.ckpt"
    forged.write_bytes(MAGIC + hashlib.sha256(data).digest() + data)  # a valid checksum over a pickled object
    with pytest.raises(CheckpointError, match="refusing to load .* other than tensors"):
        load_checkpoint(forged)
    good = save_checkpoint(tmp_path, 2, {"round": 2})
    raw = bytearray(good.read_bytes())
    raw[-3] ^= 0xFF
    good.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="checksum"):
        load_checkpoint(good)
    (tmp_path / "x.ckpt").write_text("hello")
    with pytest.raises(CheckpointError, match="not a fedsim checkpoint"):
        load_checkpoint(tmp_path / "x.ckpt")


KILL_DURING_WRITE = """
import os, signal, sys, torch
from fedsim.core.checkpoint import save_checkpoint
save_checkpoint(sys.argv[1], 1, {"round": 1, "params": torch.ones(1000)})
os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)  # die in the middle of the next write
save_checkpoint(sys.argv[1], 2, {"round": 2, "params": torch.zeros(1000)})
"""


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_one_usable(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", KILL_DURING_WRITE, str(tmp_path)], timeout=120)
    assert done.returncode == -signal.SIGKILL
    assert [p.name for p in list_checkpoints(tmp_path)] == ["round-000001.ckpt"]  # no half file under a real name
    assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # the interrupted write stayed a temporary
    path, state = load_latest(tmp_path)
    assert state["round"] == 1 and torch.equal(state["params"], torch.ones(1000))
    save_checkpoint(tmp_path, 2, {"round": 2})  # the next write clears the leftover
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round-000001.ckpt", "round-000002.ckpt"]


# --- end to end through the CLI ----------------------------------------------------------------

ROUNDS = 8  # every kill comes by round 4: the server and client state of several rounds is lost, and 4 or more
# rounds are left for the run to still be running when the signal comes, and to resume


def _args(run_dir: Path, *overrides: str) -> list[str]:
    return [
        f"num_rounds={ROUNDS}",
        "checkpoint_every=1",
        "logger.progress=false",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]


def _cli(run_dir: Path, *overrides: str) -> list[str]:
    """The command line of a run in its own process: for the runs that a signal stops."""
    return [sys.executable, "-m", "fedsim", *_args(run_dir, *overrides)]


def _final_params(run_dir: Path) -> torch.Tensor:
    return load_latest(run_dir / "checkpoints")[1]["params"]


def _metrics(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(MEASURED)} for r in records]


def _wait_for_rounds(run_dir: Path, rounds: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    path = run_dir / "metrics.jsonl"
    while not (path.exists() and len(path.read_text().splitlines()) >= rounds):
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert time.monotonic() < deadline, "timed out waiting for rounds"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each strategy's run without interruption (in this process: nothing stops it)."""
    runs = {
        strategy: tmp_path_factory.mktemp(f"full-{strategy}")
        for strategy in ("fedavg", "ditto", "fedadam", "fedbuff", "private")
    }
    for strategy, run_dir in runs.items():
        done = run_cli(_args(run_dir, *_settings(strategy)))
        assert done.returncode == 0, done.stderr
    return runs


def _settings(strategy: str) -> list[str]:
    """Ditto (personal models in client state) with every client evaluated with both models every round; FedBuff on
    the simulated clock (its checkpoint holds the clock, the tasks in flight and their start weights)."""
    extra = {
        "ditto": ["evaluate_clients=all"],
        "fedbuff": ["clock=sampled", *FEDBUFF_COMPRESSED],
        "private": PRIVATE_COMPRESSED,
    }
    return [f"strategy={strategy}" if strategy != "private" else "strategy=fedavg", *extra.get(strategy, [])]


# FedBuff attacked by ALIE (crafted from each server step's buffer), with top-k and error feedback up (residuals in
# client state, committed with each server step), QSGD down (seeded by the model version) and clients that go
# offline mid-task (18 s availability period)
FEDBUFF_COMPRESSED = [
    "clock.always_online=false",
    "clock.period_h=0.005",
    "clock.online_fraction_mean=0.2",
    "attack=alie",
    "compression=topk",
    "compression.uplink=[{name: topk, fraction: 0.1}]",
    "compression.downlink=[{name: qsgd, bits: 4}]",
]

# DP-FedAvg with adaptive clipping (the ledger and the clip norm in the checkpoint), an omniscient attack (ALIE) and
# every codec kind each way:
# top-k then QSGD up with error feedback (residuals in client state), fp16 down
PRIVATE_COMPRESSED = [
    "dp=adaptive",
    "attack=alie",
    "compression=topk",
    "compression.uplink=[{name: topk, fraction: 0.1}, {name: qsgd, bits: 4}]",
    "compression.downlink=[fp16]",
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "kill_after"), [("ditto", 3), ("fedadam", 4), ("fedbuff", 4), ("private", 3)]
)  # plain FedAvg: test_resume_auto_starts_fresh_then_continues_a_killed_run_bitwise
def test_sigkilled_run_resumes_bitwise(
    strategy: str, kill_after: int, tmp_path: Path, uninterrupted: dict[str, Path]
) -> None:
    proc = subprocess.Popen(_cli(tmp_path, *_settings(strategy)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_rounds(tmp_path, kill_after, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert len(_metrics(tmp_path)) < ROUNDS
    done = run_cli(_args(tmp_path, *_settings(strategy), "resume=true"))
    assert done.returncode == 0, done.stderr
    full = uninterrupted[strategy]
    assert torch.equal(_final_params(tmp_path), _final_params(full))
    assert _metrics(tmp_path) == _metrics(full)
    _assert_one_value_per_round(tmp_path)
    if strategy == "ditto":  # every client's global and personal scores, every round, as in the uninterrupted run
        assert "eval_personal/accuracy_worst10" in _metrics(full)[-1]
        files = sorted((full / "client_eval").iterdir())
        assert len(files) == ROUNDS and [p.read_text() for p in files] == [
            (tmp_path / "client_eval" / p.name).read_text() for p in files
        ]


@pytest.mark.slow
def test_resume_auto_starts_fresh_then_continues_a_killed_run_bitwise(
    tmp_path: Path, uninterrupted: dict[str, Path]
) -> None:
    """The same command twice, as a requeued SLURM job runs it: the first starts (no checkpoint yet), is killed,
    the second continues from the newest checkpoint and ends bitwise equal to an undisturbed run."""
    command = _args(tmp_path, "strategy=fedavg", "resume=auto")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedsim", *command], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for_rounds(tmp_path, 3, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert 3 <= len(_metrics(tmp_path)) < ROUNDS
    again = run_cli(command)
    assert again.returncode == 0, again.stderr
    assert torch.equal(_final_params(tmp_path), _final_params(uninterrupted["fedavg"]))
    assert _metrics(tmp_path) == _metrics(uninterrupted["fedavg"])
    _assert_one_value_per_round(tmp_path)
    finished = run_cli(command)
    assert finished.returncode == 0 and "nothing to do" in finished.stderr


def _assert_one_value_per_round(run_dir: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0}).Reload()
    for tag in ("train/loss", "eval/accuracy", "participants/num_sampled"):
        steps = [e.step for e in events.Scalars(tag)]
        assert steps == list(range(1, ROUNDS + 1)), (tag, steps)


@pytest.mark.slow
def test_sigint_stops_at_a_safe_point_and_resume_finishes(tmp_path: Path, uninterrupted: dict[str, Path]) -> None:
    proc = subprocess.Popen(
        _cli(tmp_path, *_settings("ditto"), "checkpoint_every=0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_rounds(tmp_path, 4, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "resume=" in err
    stopped_at = len(_metrics(tmp_path))
    assert load_latest(tmp_path / "checkpoints")[1]["round"] == stopped_at < ROUNDS
    done = run_cli(_args(tmp_path, *_settings("ditto"), f"resume={tmp_path}"))
    assert done.returncode == 0, done.stderr
    assert torch.equal(_final_params(tmp_path), _final_params(uninterrupted["ditto"]))


@pytest.mark.slow
def test_resume_errors_are_one_line(tmp_path: Path, uninterrupted: dict[str, Path]) -> None:
    nothing = run_cli(_args(tmp_path, "resume=true"))
    assert nothing.returncode == 2 and nothing.stderr.strip().startswith("fedsim: error: no checkpoint")
    assert len(nothing.stderr.strip().splitlines()) == 1
    other = run_cli(_args(tmp_path / "b", "strategy=ditto", "clients_per_round=5", f"resume={uninterrupted['ditto']}"))
    assert other.returncode == 2 and len(other.stderr.strip().splitlines()) == 1
    assert "clients_per_round (10 -> 5)" in other.stderr  # the settings check names it (issue #41)


# --- checkpoints keep the history's scalars; the per-client rows come back from metrics.jsonl ---------------


def _small_server(run_dir: Path, num_rounds: int, rows_in_memory: bool = True, per_round: int = 3):  # noqa: ANN202
    from fedsim.observe.run_logger import RunLogger

    return tiny_server(
        num_rounds=num_rounds,
        clients_per_round=per_round,
        seed=5,
        logger=RunLogger(run_dir, tensorboard=False, progress=False, client_rows_in_memory=rows_in_memory),
        checkpoints=Checkpoints(dir=run_dir / "checkpoints", every=1),
    )


def test_a_python_api_resume_of_another_setup_names_what_differs(tmp_path: Path) -> None:
    """A Server built from Python has no settings to compare: the fingerprint says what differs, in one line."""
    _small_server(tmp_path / "run", 2).run()
    other = _small_server(tmp_path / "run", 4, per_round=4)
    with pytest.raises(CheckpointError) as caught:
        other.resume(tmp_path / "run")
    line = str(caught.value)
    assert "belongs to another run setup: clients_per_round (3 -> 4); resume with the setup" in line
    assert "\n" not in line and "num_params" not in line


def _records(run_dir: Path) -> list[dict]:
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith(MEASURED)}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]


def test_checkpoints_leave_client_rows_to_metrics_jsonl_and_resume_restores_them(tmp_path: Path) -> None:
    full = _small_server(tmp_path / "full", 6)
    full.run()
    first = _small_server(tmp_path / "cut", 4)
    first.run()
    history = load_latest(tmp_path / "cut" / "checkpoints")[1]["history"]
    assert len(history) == 4 and not any("clients" in record for record in history)  # checkpoints stay small
    resumed = _small_server(tmp_path / "cut", 6)
    resumed.resume(tmp_path / "cut")
    resumed.run()
    assert _records(tmp_path / "cut") == _records(tmp_path / "full")
    assert all(len(record["clients"]) == 3 for record in _records(tmp_path / "cut"))


def test_client_rows_can_live_on_disk_only_and_resume_still_writes_them(tmp_path: Path) -> None:
    """client_rows_in_memory=False (as python -m fedsim runs): the history holds scalars only, metrics.jsonl
    holds the same rows as with them in memory, through a resume too."""
    full = _small_server(tmp_path / "full", 5).run()
    first = _small_server(tmp_path / "lean", 3, rows_in_memory=False)
    assert not any("clients" in record for record in first.run().history)
    resumed = _small_server(tmp_path / "lean", 5, rows_in_memory=False)
    resumed.resume(tmp_path / "lean")
    lean = resumed.run()
    assert not any("clients" in record for record in lean.history)
    assert [{k: v for k, v in r.items() if not k.startswith(MEASURED)} for r in lean.history] == [
        {k: v for k, v in r.items() if k != "clients" and not k.startswith(MEASURED)} for r in full.history
    ]
    assert _records(tmp_path / "lean") == _records(tmp_path / "full")
    assert all(len(record["clients"]) == 3 for record in _records(tmp_path / "lean"))


def test_resume_without_metrics_jsonl_keeps_the_scalars_and_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _small_server(tmp_path, 3).run()
    (tmp_path / "metrics.jsonl").unlink()
    resumed = _small_server(tmp_path, 5)
    with caplog.at_level(logging.WARNING, logger="fedsim"):
        resumed.resume(tmp_path)
    assert "per-client rows of 3 round(s) were not found" in caplog.text
    resumed.run()
    records = _records(tmp_path)
    assert [r["round"] for r in records] == [1, 2, 3, 4, 5]
    assert ["clients" in r for r in records] == [False, False, False, True, True]


def test_a_new_run_replaces_a_stale_metrics_file(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"round": 1, "stale": true}\n' * 7)
    _small_server(tmp_path, 2).run()
    assert [r["round"] for r in _records(tmp_path)] == [1, 2] and not any("stale" in r for r in _records(tmp_path))
