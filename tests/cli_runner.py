"""Run the ``fedsim`` command line inside the test process: the same arguments, exit status, stdout, stderr and
files as ``python -m fedsim ...`` in a subprocess, without paying a fresh interpreter and ``import torch`` (2-5 s
on the 2-core CI machine) for behaviour that does not depend on being a new process.

Use a subprocess where the process itself is the subject (a signal, a kill, an import in a fresh interpreter,
what a child inherits); use :func:`run_cli` everywhere else.

What a subprocess would have kept apart is put back after each call: the working directory, the environment
variables given in ``env``, ``sys.path``, the file descriptors 1 and 2 (captured, so that worker processes' output
is captured too, as with ``capture_output=True``), ``sys.stdout``/``sys.stderr``, and the logging handlers that
Hydra installs for the run (its ``run.log`` file handler is closed).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

# the variables a test's subprocess used to drop from the environment: a developer's own settings must not
# change what a test sees
DROPPED_ENV = ("FEDSIM_DATA_ROOT", "HYDRA_FULL_ERROR")


def run_cli(
    args: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str | None] | None = None,
    pythonpath: Sequence[str | os.PathLike[str]] = (),
) -> subprocess.CompletedProcess[str]:
    """``fedsim ARGS`` in this process. ``env``: variables to set (``None``: unset) for the call, on top of
    :data:`DROPPED_ENV` unset; ``pythonpath``: folders importable for the call (also given to worker processes
    through ``PYTHONPATH``, as a subprocess's would be). Returns what ``subprocess.run(..., capture_output=True,
    text=True)`` would: ``returncode`` (0 when the command returned normally), ``stdout`` and ``stderr``."""
    from fedsim.cli.command import main

    changes: dict[str, str | None] = {name: None for name in DROPPED_ENV}
    changes.update(env or {})
    paths = [str(Path(p).resolve()) for p in pythonpath]
    if paths:
        changes["PYTHONPATH"] = os.pathsep.join(
            [*paths, *filter(None, [(env or {}).get("PYTHONPATH") or os.environ.get("PYTHONPATH")])]
        )
    code = 0
    with _environment(changes), _sys_path(paths), _working_dir(cwd), _captured_fds() as output, _logging_restored():
        try:
            main(list(args))
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            if not isinstance(stop.code, (int, type(None))):
                print(stop.code, file=sys.stderr)  # as the interpreter does with sys.exit("message")
    return subprocess.CompletedProcess(["fedsim", *args], code, output["stdout"], output["stderr"])


@contextlib.contextmanager
def warnings_on_stderr() -> Iterator[None]:
    """Python warnings printed on stderr while inside, as a fresh interpreter prints them: pytest records them
    instead, so a test of what ``fedsim ARGS`` prints wraps :func:`run_cli` in this to see them where a user would."""

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, *_: object) -> None:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno))

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


@contextlib.contextmanager
def _environment(changes: Mapping[str, str | None]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in changes}
    for name, value in changes.items():
        _set_env(name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            _set_env(name, value)


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


@contextlib.contextmanager
def _sys_path(paths: Sequence[str]) -> Iterator[None]:
    saved = list(sys.path)
    sys.path[:0] = paths
    try:
        yield
    finally:
        sys.path[:] = saved


@contextlib.contextmanager
def _working_dir(cwd: str | os.PathLike[str] | None) -> Iterator[None]:
    saved = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved)


@contextlib.contextmanager
def _captured_fds() -> Iterator[dict[str, str]]:
    """Fds 1 and 2 (and ``sys.stdout``/``sys.stderr`` on top of them) go to temporary files for the call; the
    returned dict gets their text on leaving."""
    output: dict[str, str] = {}
    streams = {"stdout": (1, sys.stdout), "stderr": (2, sys.stderr)}
    for stream in streams.values():
        stream[1].flush()
    with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
        files = {"stdout": out_file, "stderr": err_file}
        saved_fds = {name: os.dup(fd) for name, (fd, _) in streams.items()}
        for name, (fd, _) in streams.items():
            os.dup2(files[name].fileno(), fd)
        sys.stdout = io.TextIOWrapper(os.fdopen(os.dup(1), "wb"), encoding="utf-8", line_buffering=True)
        sys.stderr = io.TextIOWrapper(os.fdopen(os.dup(2), "wb"), encoding="utf-8", line_buffering=True)
        try:
            yield output
        finally:
            for name in streams:
                getattr(sys, name).close()
                setattr(sys, name, streams[name][1])
                os.dup2(saved_fds[name], streams[name][0])
                os.close(saved_fds[name])
                files[name].seek(0)
                output[name] = files[name].read().decode("utf-8", errors="replace")


@contextlib.contextmanager
def _logging_restored() -> Iterator[None]:
    """Hydra configures the root logger for the run (a console handler, a ``run.log`` file handler) and fedsim
    its ``fedsim`` logger; both come back as they were, the run's handlers closed. Hydra's ``dictConfig`` also
    closes every handler the process has made so far (``logging.config._clearExistingHandlers``), which a fresh
    process has none of: they are out of its sight for the call (absl's handler, say, closes the stream it was
    made with, which under pytest is pytest's capture file)."""
    loggers = [logging.getLogger(), logging.getLogger("fedsim")]
    saved = [(logger, list(logger.handlers), logger.level, logger.propagate, logger.disabled) for logger in loggers]
    was_disabled = {
        name: logger.disabled
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    existing, named = list(logging._handlerList), dict(logging._handlers)  # type: ignore[attr-defined]
    del logging._handlerList[:]  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for logger, handlers, level, propagate, off in saved:
            for handler in logger.handlers:
                if handler not in handlers:
                    handler.close()
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate, logger.disabled = propagate, off
        for name, logger in logging.root.manager.loggerDict.items():  # Hydra's dictConfig may disable loggers
            if isinstance(logger, logging.Logger):
                logger.disabled = was_disabled.get(name, False)
        logging._handlerList[:0] = existing  # type: ignore[attr-defined]
        for name, handler in named.items():
            logging._handlers.setdefault(name, handler)  # type: ignore[attr-defined]
