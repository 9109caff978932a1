"""The ``fedsim`` command's entry around Hydra: one line and an exit status for what Hydra itself fails to write
(the run directory's ``.hydra/`` on a full disk, a directory name too long), Hydra's own report for everything else.

It reads two private details of hydra-core 1.3 (the ``_save_config``/``run_job`` frames of ``hydra.core.utils``,
to name the file, and ``hydra._internal.utils.run_and_report``); without the first the line says "the run
directory"."""

from __future__ import annotations

import errno
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from fedsim.cli.override_errors import override_error_line
from fedsim.core.errors import JobFailed
from fedsim.core.storage import STORAGE_ERRNOS, write_remedy


def fail(message: str, status: int) -> NoReturn:
    """End the command with one line on stderr, ``fedsim: error: <message>``, and exit ``status``."""
    print(f"fedsim: error: {message}", file=sys.stderr)
    sys.exit(status)


def run_hydra_entry(entry: Any) -> None:
    """Call a ``@hydra.main`` function so that Hydra failing to write the run directory itself (``.hydra/`` on a
    full disk or a read-only filesystem) or refusing an unknown key or option is one line and exit status 2;
    Hydra reports anything else its way."""
    previous = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra's errors come up to here instead of being printed with a traceback
    try:
        entry()
    except JobFailed as error:  # re-raised by Hydra's sweeper once every job of the sweep has run
        fail(
            f"{error} (a job of the sweep; the others ran: python -m fedsim.report <sweep dir> lists them)",
            error.status,
        )
    except Exception as error:
        _restore_env("HYDRA_FULL_ERROR", previous)
        line = hydra_write_failure(error, task=entry.__wrapped__) or override_error_line(error)
        if line is not None:
            fail(line, 2)
        report_as_hydra(error)
    finally:
        _restore_env("HYDRA_FULL_ERROR", previous)


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def hydra_write_failure(error: BaseException, task: Callable[..., Any]) -> str | None:
    """One line (without ``fedsim: error:``) when ``error`` is Hydra failing to write the run directory before it
    called ``task`` (``.hydra/config.yaml`` on a full disk or a read-only filesystem, a name in the directory's path
    over the filesystem's limit), else ``None``. Hydra's
    error names no file; its ``_save_config`` frame (or ``run_job``'s) says which it was writing."""
    if (
        not isinstance(error, OSError)
        or type(error).__module__.startswith("hydra")
        or error.errno not in {*STORAGE_ERRNOS, errno.ENAMETOOLONG}
    ):
        return None
    saving, job_dir = None, None
    for frame, _ in traceback.walk_tb(error.__traceback__):
        if frame.f_code is getattr(task, "__code__", None):
            return None  # raised by the run itself, which reports its own errors
        if frame.f_globals.get("__name__") == "hydra.core.utils":
            if frame.f_code.co_name == "_save_config":
                saving = Path(frame.f_locals["output_dir"]) / frame.f_locals["filename"]
            elif frame.f_code.co_name == "run_job":
                job_dir = frame.f_locals.get("output_dir")
    target = error.filename or saving or job_dir or "the run directory"
    if error.errno == errno.ENAMETOOLONG:  # a directory the command line named (fedsim's own names fit)
        return (
            f"cannot create {target}: {error.strerror}; choose a shorter hydra.run.dir (in a sweep: hydra.sweep.dir "
            "or hydra.sweep.subdir): one name in a path holds at most 255 bytes"
        )
    return (
        f"cannot write {target}: {error.strerror}; {write_remedy(error, job_dir or 'it')} "
        "or choose another hydra.run.dir"
    )


def report_as_hydra(error: BaseException) -> NoReturn:
    """Report ``error`` the way Hydra reports a failed run (its own errors in one line, others as the traceback
    from the task function on, all of it with ``HYDRA_FULL_ERROR=1``) and exit with status 1."""
    from hydra._internal.utils import run_and_report

    start = error.__traceback__
    while start is not None and start.tb_frame.f_code.co_name != "run_job":
        start = start.tb_next  # Hydra trims the frames above run_job when it finds it near the top

    def fail() -> None:
        raise error.with_traceback(start or error.__traceback__)

    run_and_report(fail)
    raise error  # not reached: run_and_report exits
