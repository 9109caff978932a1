"""Executors run client tasks: serial (the reference), persistent worker processes, Ray actors, vmap, and ``auto``,
which picks serial or process from what the first round costs.

Names are imported on first use, so that importing a module of this package (``python -m fedsim`` imports
fedsim/executor/process/forkserver.py to start the workers' forkserver) does not import torch and every executor
first: the forkserver's own imports then overlap with the main process's.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedsim.executor.auto import AutoExecutor
    from fedsim.executor.base import Executor, Workload
    from fedsim.executor.process import ProcessExecutor
    from fedsim.executor.ray import RayExecutor
    from fedsim.executor.serial import SerialExecutor
    from fedsim.executor.vmap import VmapExecutor, VmapUnsupportedError

_EXPORTS = {
    "AutoExecutor": "fedsim.executor.auto",
    "Executor": "fedsim.executor.base",
    "ProcessExecutor": "fedsim.executor.process",
    "RayExecutor": "fedsim.executor.ray",  # imports the ray library only when instantiated
    "SerialExecutor": "fedsim.executor.serial",
    "VmapExecutor": "fedsim.executor.vmap",
    "VmapUnsupportedError": "fedsim.executor.vmap",
    "Workload": "fedsim.executor.base",
}

__all__ = [
    "AutoExecutor",
    "Executor",
    "ProcessExecutor",
    "RayExecutor",
    "SerialExecutor",
    "VmapExecutor",
    "VmapUnsupportedError",
    "Workload",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fedsim.executor' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return __all__
