"""Progress of the slow steps outside the rounds (fedsim/core/progress.py): lines on the log off a terminal, a bar
with a rate and the time left on one (a real pseudo-terminal), nothing under ``logger=quiet``, and never a metric.
A large Synthetic run's start-up (data generation, partitioning, every-client scoring) shows it; a small one stands
in for a million devices with ``logger.progress_after=0``."""

from __future__ import annotations

import fcntl
import logging
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runner import run_cli
from own_processes import live_tagged, new_tag, tagged_environment

from fedsim.core import progress as progress_module
from fedsim.core.progress import configure, progress

REPO = Path(__file__).resolve().parents[2]
STARTUP = [
    "data.num_devices=1000",
    "+data.size_mean_log=0",
    "+data.size_sigma_log=0",
    "+data.min_size=9",
    "clients_per_round=5",
    "num_rounds=1",
    "evaluate_clients=all",
    "logger.progress_after=0",
]
STEPS = ("data: 1,000 Synthetic devices", "partitioning 8,000 rows", "scoring 1,000 clients")  # 8 of 10 rows train


@pytest.fixture(autouse=True)
def settings_put_back() -> Iterator[None]:
    saved = (progress_module.SETTINGS.enabled, progress_module.SETTINGS.after)
    yield
    configure(*saved)


def test_off_a_terminal_a_step_writes_lines_with_count_rate_and_time_left(caplog: pytest.LogCaptureFixture) -> None:
    configure(None, 0)
    caplog.set_level(logging.INFO, logger="fedsim")
    with progress("counting", 4, "thing") as advance:
        advance(1)  # the first line came at the start; the next is due after LINE_EVERY_S
        progress_module.LINE_EVERY_S, saved = 0.0, progress_module.LINE_EVERY_S
        try:
            time.sleep(0.01)
            advance(1)
        finally:
            progress_module.LINE_EVERY_S = saved
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("counting: 0/4 things (0%), 0 things/s")
    assert re.fullmatch(r"counting: 2/4 things \(50%\), [\d,]+ things/s, about \d+ s left", lines[1]), lines
    assert re.fullmatch(r"counting: done, 2 things in \d+\.\d s", lines[-1]) and len(lines) == 3


def test_a_step_shorter_than_progress_after_writes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    configure(None, 30)
    caplog.set_level(logging.INFO, logger="fedsim")
    with progress("quick", 3, "thing") as advance:
        advance(3)
    assert caplog.records == []


def test_progress_false_shows_nothing_and_true_forces_the_bar(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO, logger="fedsim")
    configure(False, 0)
    with progress("hidden", 3, "thing") as advance:
        advance(3)
    assert caplog.records == [] and capsys.readouterr().err == ""
    configure(True, 0)
    with progress("forced", 3, "thing") as advance:
        advance(3)
    err = capsys.readouterr().err
    assert "\rforced:   0%|" in err and "| 0/3 [00:00<?, ?thing/s]" in err and caplog.records == []  # a bar, no line
    assert err.endswith("\r") and err.rsplit("\r", 2)[-2].strip() == ""  # cleared when the step ended


def test_bad_settings_are_one_line() -> None:
    with pytest.raises(ValueError, match=r"^logger.progress_after must be a number of seconds >= 0 \(got -1\)$"):
        configure(None, -1)
    with pytest.raises(ValueError, match=r"^logger.progress must be true, false or null \(got 'yes'\)$"):
        configure("yes", 3)  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_run_off_a_terminal_logs_its_start_up_progress_to_run_log_and_never_to_metrics(tmp_path: Path) -> None:
    done = run_cli([*STARTUP, f"hydra.run.dir={tmp_path / 'run'}"])
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "run" / "run.log").read_text()
    for step in STEPS:
        assert f"{step}: done" in log, (step, log)
    assert re.search(rf"{STEPS[0]}: [\d,]+/[\d,]+ draws \(\d+%\), [\d,]+ draws/s", log)
    assert not any(step in done.stdout + done.stderr for step in STEPS)  # run.log's alone: the console is no terminal
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert metrics and not any(step.split(":")[0] in metrics for step in STEPS) and "draws" not in metrics
    quiet = run_cli([*STARTUP, "logger=quiet", f"hydra.run.dir={tmp_path / 'quiet'}"])
    assert quiet.returncode == 0, quiet.stderr
    assert not any(step in (tmp_path / "quiet" / "run.log").read_text() for step in STEPS)
    assert not any(step in quiet.stdout + quiet.stderr for step in STEPS)


def _on_a_terminal(args: list[str], cwd: Path) -> str:
    """What ``python -m fedsim ARGS`` writes to a 120-column pseudo-terminal (its stdout and stderr).

    The bars redraw on every count (``TQDM_MININTERVAL=0``, tqdm's own setting, read from the environment), not at
    most every 0.1 s: on an idle machine a step can end within 0.1 s of its first drawing, and then the bar would
    have shown only its 0% state (no rate, no time left) before it was cleared."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    tag = new_tag()
    env = {
        **tagged_environment(tag),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "TQDM_MININTERVAL": "0",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedsim", *args], stdin=child, stdout=child, stderr=child, cwd=cwd, env=env
    )
    os.close(child)
    out = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the terminal's last writer exited
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    assert proc.wait(timeout=300) == 0, out.decode(errors="replace")[-3000:]
    assert not live_tagged(tag)
    return out.decode(errors="replace")


@pytest.mark.slow
def test_on_a_terminal_the_start_up_shows_bars_with_rate_and_time_left(tmp_path: Path) -> None:
    shown = _on_a_terminal([*STARTUP, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    bars = [piece for piece in shown.split("\r") if piece.startswith(STEPS[0])]
    rate_and_time_left = r"\d+%\|.*\| [\d.]+[kM]?/[\d.]+M \[\d\d:\d\d<\d\d:\d\d, +[\d.]+[kM]?draw/s\]"
    assert any(re.search(rate_and_time_left, b) for b in bars), bars
    assert any(piece.startswith(STEPS[2]) for piece in shown.split("\r")), shown[-2000:]
    assert f"{STEPS[0]}: done" not in (tmp_path / "run" / "run.log").read_text()  # a bar, not lines
    # logger=quiet shows nothing on a terminal either: it sets logger.progress=false (its run off a terminal in
    # test_a_run_off_a_terminal_logs_its_start_up_progress_to_run_log_and_never_to_metrics has no line in run.log
    # and no bar on the console), and a step with progress off returns before it asks whether stderr is a terminal
    # (test_progress_false_shows_nothing_and_true_forces_the_bar)


@pytest.mark.slow
def test_scoring_in_several_executor_calls_gives_the_one_call_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedsim.cli.run import build_server, compose
    from fedsim.client.evaluation import eval_tasks
    from fedsim.server import federated_eval

    server = build_server(compose(["data.num_devices=100", "evaluate_clients=all", "logger=quiet"]))
    server.parts.executor.start(server.workload())
    groups = eval_tasks(1, range(100), server.clients)
    assert len(groups) == 3  # about 2048 test examples a group: three calls instead of one
    whole = server.evaluate_clients(1, [])
    monkeypatch.setattr(federated_eval, "TASKS_PER_CALL", 1)  # every client group a call of its own
    assert server.evaluate_clients(1, []) == whole and whole["eval_global/accuracy_mean"] > 0


@pytest.mark.slow
def test_the_million_devices_preset_shows_its_start_up_although_its_rounds_are_quiet(tmp_path: Path) -> None:
    """experiment=million_devices (logger=quiet with logger.progress=null) on 1,000 devices: the start-up's progress
    is a bar on a terminal and lines in run.log elsewhere, while the console has no round line."""
    preset = ["experiment=million_devices", "data.num_devices=1000", "num_rounds=1", "logger.progress_after=0"]
    done = run_cli([*preset, f"hydra.run.dir={tmp_path / 'log'}"])
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "log" / "run.log").read_text()
    assert all(f"{step}: done" in log for step in STEPS[:2]), log
    assert not any(step in done.stdout + done.stderr for step in STEPS) and "round 1:" not in done.stdout + done.stderr
    assert "draws" not in (tmp_path / "log" / "metrics.jsonl").read_text()
    shown = _on_a_terminal([*preset, f"hydra.run.dir={tmp_path / 'terminal'}"], tmp_path)
    assert any(piece.startswith(STEPS[0]) and "draw/s" in piece for piece in shown.split("\r")), shown[-2000:]
