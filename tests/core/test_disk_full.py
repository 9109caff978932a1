"""A full disk or a read-only filesystem, on real tmpfs mounts: before round 1 it is one line and exit status 2;
mid-run it is one line and exit status 1, the newest checkpoint stays intact, and a resume after freeing
space ends bitwise equal to an undisturbed run. Never a traceback.

Needs root with CAP_SYS_ADMIN (``mount -t tmpfs``); the tests skip, saying so, where mounting is refused.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli

from fedsim.cli.run import compose, run_config
from fedsim.core.checkpoint import list_checkpoints, load_checkpoint, load_latest, save_checkpoint
from fedsim.core.errors import RunWriteError
from fedsim.core.storage import LogFileErrors

BASE = ["num_rounds=2", "clients_per_round=3", "logger.progress=false", "logger.tensorboard=false", "+data.max_size=60"]
PAGE = 4096  # tmpfs allocates whole pages; check_writable's probe is one page

Mount = Callable[..., Path]


@pytest.fixture()
def tmpfs() -> Iterator[Mount]:
    """``tmpfs(where, size)`` mounts a fresh tmpfs at ``where``; every mount is undone afterwards, pass or fail."""
    mounted: list[Path] = []

    def mount(where: Path, size: str = "256k") -> Path:
        where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); these tests need root with CAP_SYS_ADMIN")
        mounted.append(where)
        return where

    try:
        yield mount
    finally:
        for where in reversed(mounted):
            if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(where)], check=True)


def fill(directory: Path, leave: int = 0) -> Path:
    """Fill the filesystem of ``directory`` with a ballast file, leaving ``leave`` bytes (whole pages) free."""
    ballast = directory / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, bytes(PAGE))
    except OSError as error:
        assert error.errno == errno.ENOSPC
    os.ftruncate(fd, os.fstat(fd).st_size - leave)
    os.close(fd)
    stats = os.statvfs(directory)
    assert stats.f_bavail * stats.f_frsize == leave
    return ballast


def remount(where: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(where)], check=True)


def cli(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """``fedsim`` with these overrides, in this process (tests/cli_runner.py): the same lines and exit status."""
    return run_cli([*BASE, *overrides, f"hydra.run.dir={run_dir}"])


def error_line(stderr: str) -> str:
    """The one line stderr must consist of."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedsim: error: "), stderr
    return lines[0]


# --- before any work: exit status 2 -------------------------------------------------------------------------


def test_a_full_disk_at_start_is_one_line_naming_hydras_file_and_exit_2(tmpfs: Mount, tmp_path: Path) -> None:
    disk = tmpfs(tmp_path / "disk", "64k")
    fill(disk)
    done = cli(disk / "run")
    assert done.returncode == 2, done.stderr
    assert error_line(done.stderr) == (
        f"fedsim: error: cannot write {disk}/run/.hydra/config.yaml: No space left on device; "
        "free space or choose another hydra.run.dir"
    )
    assert "Callback" not in done.stderr, "no warning of Hydra's about the directory lock before the one line"


@pytest.mark.parametrize(
    ("how", "reason", "remedy"),
    [
        ("full", "No space left on device", "free space"),
        ("read-only", "Read-only file system", "make it writable"),
    ],
    ids=["full", "read-only"],
)
def test_a_full_or_read_only_checkpoints_dir_is_refused_before_round_1(
    how: str, reason: str, remedy: str, tmpfs: Mount, tmp_path: Path
) -> None:
    checkpoints = tmpfs(tmp_path / "run" / "checkpoints", "64k")
    if how == "full":
        fill(checkpoints)
    else:
        remount(checkpoints, "ro")
    done = cli(tmp_path / "run")
    assert done.returncode == 2, done.stderr
    assert error_line(done.stderr) == (
        f"fedsim: error: cannot write checkpoints into {checkpoints}: {reason}; {remedy} "
        "or choose another hydra.run.dir"
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists(), "no work may start"


# --- mid-run: exit status 1, the newest checkpoint intact, resume bitwise ------------------------------------


def test_a_failed_checkpoint_write_keeps_the_previous_one_and_no_temporary(tmpfs: Mount, tmp_path: Path) -> None:
    checkpoints = tmpfs(tmp_path / "checkpoints", "64k")
    first = save_checkpoint(checkpoints, 1, {"params": torch.zeros(10)})
    fill(checkpoints)
    with pytest.raises(RunWriteError) as caught:
        save_checkpoint(checkpoints, 2, {"params": torch.zeros(10_000)})
    assert caught.value.errno == errno.ENOSPC and caught.value.path == checkpoints / "round-000002.ckpt"
    assert str(caught.value) == f"cannot write {checkpoints}/round-000002.ckpt: No space left on device"
    assert list_checkpoints(checkpoints) == [first] and not list(checkpoints.glob("*.tmp"))
    assert torch.equal(load_checkpoint(first)["params"], torch.zeros(10))


def test_a_log_file_on_a_full_disk_is_kept_as_one_error_not_a_traceback_per_line(
    tmpfs: Mount, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    disk = tmpfs(tmp_path / "disk", "64k")
    handler = logging.FileHandler(disk / "run.log")  # what Hydra attaches to the root logger
    logging.getLogger().addHandler(handler)
    try:
        ballast = fill(disk)
        with LogFileErrors() as log_file:
            for _ in range(3):
                logging.getLogger("fedsim").warning("a line that does not fit %s", "x" * 100)
        ballast.unlink()  # room again, so that closing can flush what the handler still holds
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    assert "Logging error" not in capfd.readouterr().err
    assert str(log_file.first) == f"cannot write {disk}/run.log: No space left on device"
    assert "handleError" not in vars(handler), "the handler's own error handling comes back afterwards"


def _assert_stopped_with_round_2_intact(
    done: subprocess.CompletedProcess[str], run_dir: Path, failed: str, kept: bytes
) -> None:
    checkpoints = run_dir / "checkpoints"
    assert done.returncode == 1, done.stderr
    line = error_line(done.stderr)
    assert re.fullmatch(
        rf"fedsim: error: cannot write {checkpoints}/{failed}: No space left on device; the checkpoint of round 2 "
        rf"\({checkpoints}/round-000002\.ckpt\) is intact: free space, then continue with resume={run_dir}",
        line,
    ), line
    assert [p.name for p in list_checkpoints(checkpoints)] == ["round-000002.ckpt"]
    assert (checkpoints / "round-000002.ckpt").read_bytes() == kept and load_checkpoint(
        checkpoints / "round-000002.ckpt"
    )["round"] == 2
    assert not list(checkpoints.rglob("*.tmp"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["finished"] is False and "No space left on device" in summary["stop_reason"]


@pytest.mark.parametrize(
    ("strategy", "failed"),
    [
        ("fedavg", r"round-000003\.ckpt"),  # the checkpoint of round 3 is the first write that does not fit
        ("scaffold", r"client_state/\d+/c\d+-r3\.state"),  # the clients' new control variates come first
    ],
    ids=["fedavg-checkpoint", "scaffold-client-state"],
)
def test_a_disk_that_fills_up_mid_run_stops_in_one_line_and_resume_is_bitwise(
    strategy: str, failed: str, tmpfs: Mount, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    checkpoints = tmpfs(run_dir / "checkpoints")
    run_config(compose([*BASE, f"strategy={strategy}"]), run_dir=run_dir)
    kept = (checkpoints / "round-000002.ckpt").read_bytes()
    assert len(kept) > PAGE, "the test needs a checkpoint larger than the one page left free"
    ballast = fill(checkpoints, leave=PAGE)  # room for check_writable's probe, not for the next checkpoint
    more = [f"strategy={strategy}", "num_rounds=4", "checkpoint_every=1", "resume=true"]
    _assert_stopped_with_round_2_intact(cli(run_dir, *more), run_dir, failed, kept)

    ballast.unlink()  # space freed: the same command finishes the run
    done = cli(run_dir, *more)
    assert done.returncode == 0, done.stderr
    straight = run_config(compose([*BASE, f"strategy={strategy}", "num_rounds=4"]), run_dir=tmp_path / "straight")
    assert torch.equal(load_latest(checkpoints)[1]["params"], straight.params)
    final = [json.loads((d / "summary.json").read_text())["final_accuracy"] for d in (run_dir, tmp_path / "straight")]
    assert final[0] == final[1]


def test_a_whole_run_dir_on_a_small_disk_fails_in_one_line_whichever_write_fails(tmpfs: Mount, tmp_path: Path) -> None:
    """Everything (Hydra's run.log, metrics.jsonl, TensorBoard, checkpoints) shares a 96 KiB disk: the first write
    that does not fit ends the run, named, with the newest checkpoint intact; more room, and the resume finishes it."""
    disk = tmpfs(
        tmp_path / "disk", "96k"
    )  # room for round 1's files (TensorBoard's first event file is ~30 KB), not for 8 rounds
    run_dir = disk / "run"
    args = ["num_rounds=8", "checkpoint_every=1", "logger.tensorboard=true"]
    done = cli(run_dir, *args)
    assert done.returncode == 1, done.stderr
    match = re.fullmatch(
        rf"fedsim: error: cannot write {run_dir}/\S+: No space left on device; the checkpoint of round (\d) "
        rf"\(({run_dir}/checkpoints/round-00000\d\.ckpt)\) is intact: free space, then continue with resume={run_dir}",
        error_line(done.stderr),
    )
    assert match, done.stderr
    assert 1 <= int(match.group(1)) < 8 and load_checkpoint(Path(match.group(2)))["round"] == int(match.group(1))
    assert not list(run_dir.rglob("*.tmp"))

    remount(disk, "size=1m")
    done = cli(run_dir, *args, "resume=true")
    assert done.returncode == 0, done.stderr
    straight = run_config(compose([*BASE, "num_rounds=8"]), run_dir=tmp_path / "straight")
    assert torch.equal(load_latest(run_dir / "checkpoints")[1]["params"], straight.params)
