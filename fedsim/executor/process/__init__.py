"""The process executor: persistent worker processes, forked from a preloaded forkserver, that train clients in
parallel (:class:`ProcessExecutor` in ``executor.py``; the parent's side of each worker in ``pool.py``, the worker's
own loop in ``worker.py``; the forkserver and what it imports in ``forkserver.py`` and ``preload.py``; what a worker
cannot import by name travels by value, ``by_value.py``). :class:`ProcessExecutor` is imported on first use, so that
``forkserver.py`` can be imported (and the forkserver started) before torch is."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedsim.executor.process.executor import ProcessExecutor

__all__ = ["ProcessExecutor"]


def __getattr__(name: str) -> Any:
    if name != "ProcessExecutor":
        raise AttributeError(f"module 'fedsim.executor.process' has no attribute {name!r}")
    return importlib.import_module("fedsim.executor.process.executor").ProcessExecutor


def __dir__() -> list[str]:
    return __all__
