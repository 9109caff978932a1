"""Third-party output goes to ``run.log``; the console keeps fedsim's own lines (and Hydra's).

While a command-line run lasts (:func:`library_output_to_run_log`, entered once per run by
:mod:`fedsim.cli.command`):

* Python warnings, whoever raises them (PEFT's ``fan_in_fan_out is set to False ...``, transformers'
  ``FutureWarning``\\ s), become records of the ``py.warnings`` logger, each shown once per run;
* the Hugging Face libraries (:data:`OWN_HANDLERS`), which print through a stderr handler of their own that they
  install when imported, lose that handler and their progress bars, and their records go to the run's handlers like
  any other logger's, also when fedsim imports them during the run (:func:`fedsim.core.extras.require` calls back);
* the console handlers of Hydra's ``job_logging`` (``console``; ``logger=quiet`` sets it to WARNING) drop the
  records of third-party code: Python warnings, and whatever is logged from installed code (site-packages, the
  standard library) other than fedsim's and Hydra's, and the progress lines of :mod:`fedsim.core.progress` (a
  terminal gets a bar instead). Code of the user's own (a custom strategy, say) keeps the console.

``run.log`` (``job_logging``'s file handler) keeps every record. Process workers and Ray actors write everything,
warnings included, to their own files (:mod:`fedsim.executor.worker_log`). On leaving, everything is put back as
it was (a run in a test's or a notebook's process).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import sysconfig
import warnings
from collections.abc import Iterator
from typing import Any, TextIO

from fedsim.core.extras import after_each_import

OWN_HANDLERS = ("transformers", "datasets", "huggingface_hub")
"""Loggers of libraries that install a console handler of their own (and stop propagating) when imported."""

_OWN_LOGGERS = ("fedsim", "hydra")


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(os.path.join(paths[key], "") for key in ("stdlib", "platstdlib", "purelib", "platlib"))


@functools.lru_cache(maxsize=1024)
def _installed(path: str) -> bool:
    """Whether the source file ``path`` is installed library code: the standard library or a site-packages."""
    parts = path.replace("\\", "/").split("/")
    return "site-packages" in parts or "dist-packages" in parts or path.startswith(_library_dirs())


def third_party(record: logging.LogRecord) -> bool:
    """Whether ``record`` comes from a library rather than from fedsim, Hydra or the user's own code."""
    if record.name.split(".")[0] in _OWN_LOGGERS:
        return False
    return record.name == "py.warnings" or _installed(record.pathname)


PROGRESS_LOGGER = "fedsim.progress"
"""The lines of :mod:`fedsim.core.progress` (off a terminal): ``run.log`` only."""


class _OwnLines(logging.Filter):
    """A console handler's filter: third-party records and progress lines stay off the console (``run.log`` has
    them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not third_party(record) and record.name != PROGRESS_LOGGER


def _warning_to_log(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """``warnings.showwarning`` for the run: the warning, as Python would print it, logged to ``py.warnings``."""
    text = warnings.formatwarning(message, category, filename, lineno, line).rstrip()
    logging.getLogger("py.warnings").warning("%s", text)


class _LibraryHandlers:
    """Takes the own console handlers and progress bars of :data:`OWN_HANDLERS` off, and puts them back."""

    def __init__(self) -> None:
        self.taken: dict[str, tuple[list[logging.Handler], bool]] = {}
        self.bars: list[Any] = []  # the enable function of each library whose bars were on

    def take(self) -> None:
        """Route every library of :data:`OWN_HANDLERS` imported by now (again after each import: idempotent)."""
        for name in OWN_HANDLERS:
            logger = logging.Logger.manager.loggerDict.get(name)
            if name in self.taken or name not in sys.modules or not isinstance(logger, logging.Logger):
                continue
            own = [h for h in logger.handlers if _is_console(h)]
            self.taken[name] = (own, logger.propagate)
            for handler in own:
                logger.removeHandler(handler)
            logger.propagate = True
        self._bars_off()

    def _bars_off(self) -> None:
        hub = sys.modules.get("huggingface_hub.utils")
        if hub is not None and not hub.are_progress_bars_disabled() and hub.enable_progress_bars not in self.bars:
            hub.disable_progress_bars()
            self.bars.append(hub.enable_progress_bars)
        tf = sys.modules.get("transformers.utils.logging")
        if tf is not None and tf.is_progress_bar_enabled() and tf.enable_progress_bar not in self.bars:
            tf.disable_progress_bar()
            self.bars.append(tf.enable_progress_bar)

    def put_back(self) -> None:
        for name, (handlers, propagate) in self.taken.items():
            logger = logging.getLogger(name)
            for handler in handlers:
                logger.addHandler(handler)
            logger.propagate = propagate
        for enable in reversed(self.bars):
            enable()


def _is_console(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)


@contextlib.contextmanager
def library_output_to_run_log() -> Iterator[None]:
    """Inside: third-party warnings and log records reach ``run.log`` only (see the module's docstring). Enter it
    after Hydra has configured the run's logging."""
    consoles = [h for h in logging.getLogger().handlers if _is_console(h)]
    own_lines = _OwnLines()
    libraries = _LibraryHandlers()
    for handler in consoles:
        handler.addFilter(own_lines)
    try:
        with warnings.catch_warnings(), after_each_import(libraries.take):  # catch_warnings: shown once per run
            warnings.showwarning = _warning_to_log
            libraries.take()
            yield
    finally:
        libraries.put_back()
        for handler in consoles:
            handler.removeFilter(own_lines)
