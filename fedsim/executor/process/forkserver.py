"""The process that process workers are forked from: multiprocessing's forkserver, preloaded with torch.

A worker forked from it starts in about 20 ms with torch and fedsim already imported (fedsim/executor/process/
preload.py), where a spawned worker spent ~2.5 s in ``import torch`` and ~1.5 s in its first optimizer's lazy
imports. The forkserver imports them once per Python process: every job of a sweep after the first gets warm
workers. It is started as early as possible, so that its imports overlap with the caller's: by
``python -m fedsim`` before anything else when the command line asks for ``executor=process``, else when a
``ProcessExecutor`` is made. This module imports neither torch nor the rest of fedsim.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from multiprocessing import forkserver
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from multiprocessing.context import ForkServerContext

PRELOAD = ["fedsim.executor.process.preload"]


def worker_context() -> ForkServerContext:
    """The forkserver context, its server started (importing :data:`PRELOAD` in the background) if it is not yet.
    As under spawn, a forked worker imports the caller's script as ``__mp_main__`` (so a script keeps its
    experiment under ``if __name__ == "__main__":``); what a notebook defines reaches workers by value
    (fedsim/executor/process/by_value.py). A process that already runs a forkserver of its own keeps it and its
    preload list."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    forkserver.ensure_running()
    return context


def start_early(argv: Sequence[str]) -> None:
    """Start the forkserver now when the command line ``argv`` selects the process executor
    (``executor=process``, also in a sweep such as ``executor=serial,process``)."""
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if key == "executor" and "process" in value.split(","):
            worker_context()
            return
