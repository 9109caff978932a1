"""Per-worker log files, shared by the process workers and the Ray actors.

A worker calls :func:`redirect_output` when a run starts: from then on its prints and log records go to its own
file (``<run dir>/workers/...``), every line tagged with the round and client of the task it is
training (``[round R client C]``, or ``[idle]`` between tasks), so nothing interleaves on the console.
Without a run directory only warnings and failures reach the console.
"""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from fedsim.core.types import ClientUpdate, EvalResult, EvalTask, FitTask, TaskResult


class _TaskTag(logging.Filter):
    """Adds ``round R client C`` (or ``idle``) as ``%(task)s`` to every record of the worker's log."""

    task: FitTask | EvalTask | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        task = _TaskTag.task
        record.task = f"round {task.round_num} client {task.client_id}" if task else "idle"
        return True


class _TaggedStream:
    """A text stream that prefixes every line printed by client code with the current task."""

    def __init__(self, sink: TextIO) -> None:
        self.sink, self._at_line_start = sink, True

    def write(self, text: str) -> int:
        for piece in text.splitlines(keepends=True):
            if self._at_line_start:
                task = _TaskTag.task
                self.sink.write(f"[round {task.round_num} client {task.client_id}] " if task else "[idle] ")
            self.sink.write(piece)
            self._at_line_start = piece.endswith("\n")
        self.sink.flush()
        return len(text)

    def flush(self) -> None:
        self.sink.flush()

    def isatty(self) -> bool:
        return False


_open_file: list[tuple[TextIO, TextIO, TextIO]] = []  # the file the last call opened, and the streams it replaced


def hold_output(name: str) -> None:
    """Keep this process's prints and log records in memory, formatted as in its log file, until
    :func:`redirect_output` writes them at the head of the file: a process worker started early, while the run is
    still being built, creates no file before its run is sent to it (a refused run leaves none)."""
    held = io.StringIO()
    _open_file.append((held, sys.stdout, sys.stderr))
    sys.stdout = sys.stderr = _TaggedStream(held)
    _route_logging(name, logging.StreamHandler(held))


def redirect_output(name: str, log_path: Path | None) -> logging.Logger:
    """Route this process's prints and log records into ``log_path`` (appended), tagged with round and
    client; ``None`` goes back to the console but lets only warnings and failures through. Returns the worker's
    logger. A second call (a Ray actor reused by the next run) closes the file of the first; what
    :func:`hold_output` held goes first."""
    handler: logging.Handler
    held = ""
    while _open_file:  # an earlier call's file: close it, put its process's streams back
        stream, sys.stdout, sys.stderr = _open_file.pop()
        held = stream.getvalue() if isinstance(stream, io.StringIO) else held
        stream.close()
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        stream = open(log_path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - this process's output from now on
        stream.write(held)
        _open_file.append((stream, sys.stdout, sys.stderr))
        sys.stdout = sys.stderr = _TaggedStream(stream)
        handler = logging.StreamHandler(stream)
    else:  # no run directory: only warnings and failures reach the console
        if sys.__stderr__ is not None:
            sys.__stderr__.write(held)
        handler = logging.StreamHandler(sys.__stderr__)
        handler.setLevel(logging.WARNING)
    _route_logging(name, handler)
    return logging.getLogger(f"fedsim.worker.{name}")


def _route_logging(name: str, handler: logging.Handler) -> None:
    """Make ``handler``, in the worker's format, the root logger's only one, at INFO."""
    handler.setFormatter(logging.Formatter(f"%(asctime)s [{name}] [%(task)s] %(levelname)s %(message)s"))
    handler.addFilter(_TaskTag())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


@contextmanager
def tagged(task: FitTask | EvalTask) -> Iterator[None]:
    """Tag everything printed or logged inside the block with ``task``'s round and client."""
    _TaskTag.task = task
    try:
        yield
    finally:
        _TaskTag.task = None


def log_result(log: logging.Logger, result: TaskResult | EvalResult) -> None:
    """One line per trained client, or the failure's full traceback."""
    if isinstance(result, ClientUpdate):
        log.info(
            "trained: %d examples, train loss %.4f", result.num_examples, result.metrics.get("train_loss", float("nan"))
        )
    elif isinstance(result, EvalResult):
        log.info(
            "evaluated %d clients (%d..%d)", len(result.scores), result.scores[0].client_id, result.scores[-1].client_id
        )
    else:
        log.error("failed:\n%s", result.traceback)
