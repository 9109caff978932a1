"""Writes the storage refuses (a full disk, a read-only filesystem): the file they concern, what to do, and
keeping them to one line where a library would print a traceback per write."""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeGuard

from fedsim.core.errors import RunWriteError

_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_NOT_WRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
STORAGE_ERRNOS = _FULL | _NOT_WRITABLE | {errno.EIO}


def is_write_failure(error: BaseException) -> TypeGuard[OSError]:
    """Whether ``error`` is storage refusing a write (what :func:`write_failure_text` can explain), not a bug."""
    return isinstance(error, RunWriteError) or (isinstance(error, OSError) and error.errno in STORAGE_ERRNOS)


@contextlib.contextmanager
def naming_write_errors(path: str | Path) -> Iterator[None]:
    """Inside: an :class:`OSError` becomes a :class:`RunWriteError` naming ``path`` (``write()`` and ``flush()``
    errors name no file)."""
    try:
        yield
    except RunWriteError:
        raise
    except OSError as error:
        raise RunWriteError(path, error) from error


def write_failure_text(error: OSError, where: str | Path) -> str:
    """``cannot write <file>: <reason>``; ``where`` stands for the file when ``error`` names none."""
    if isinstance(error, RunWriteError):
        return str(error)
    return f"cannot write {error.filename or where}: {error.strerror or error}"


def write_remedy(error: OSError, what: str | Path = "it") -> str:
    """What to do about ``error`` on ``what``: free space (full disk, quota), make it writable (read-only,
    permissions), else check the filesystem."""
    if error.errno in _FULL:
        return "free space"
    if error.errno in _NOT_WRITABLE:
        return f"make {what} writable"
    return f"check the filesystem of {what}"


def closing_naming_errors(close: Callable[[], None], path: Path) -> RunWriteError | None:
    """Call ``close``; the :class:`RunWriteError` (naming ``path``) it failed with, else ``None``."""
    try:
        with naming_write_errors(path):
            close()
    except RunWriteError as error:
        return error
    return None


def quiet_writer_thread_errors() -> None:
    """TensorBoard's writer thread keeps an :class:`OSError` it hits (a full disk) and raises it again in the
    thread that logs next, where :class:`fedsim.observe.run_logger.RunLogger` names the directory; its own traceback
    is not printed too."""
    previous = threading.excepthook
    if getattr(previous, "fedsim_quiet", False):
        return

    def hook(args: Any) -> None:
        if isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_AsyncWriterThread":
            return
        previous(args)

    hook.fedsim_quiet = True  # type: ignore[attr-defined]  # a mark on the function, read back above
    threading.excepthook = hook


class LogFileErrors:
    """While inside: a write error of the root logger's file handlers (Hydra's ``run.log``) is kept in
    :attr:`first` instead of ``logging`` printing a traceback for every record it could not write. (A full
    disk then stops the run at its next metrics or checkpoint write, which says so in one line.)"""

    def __init__(self) -> None:
        self.first: RunWriteError | None = None
        self._handlers: list[logging.FileHandler] = []

    def __enter__(self) -> LogFileErrors:
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.FileHandler):
                # an instance attribute over the method, deleted again in __exit__
                handler.handleError = functools.partial(self._handle, handler)  # type: ignore[method-assign]
                self._handlers.append(handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for handler in self._handlers:
            del handler.handleError  # the class's method again
        self._handlers = []

    def _handle(self, handler: logging.FileHandler, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            type(handler).handleError(handler, record)  # a bad format string: logging's usual report
        elif self.first is None:
            self.first = RunWriteError(handler.baseFilename, error)
