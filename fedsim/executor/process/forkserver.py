"""The process that process workers are forked from: multiprocessing's forkserver, preloaded with torch.

A worker forked from it starts in about 20 ms with torch and fedsim already imported (fedsim/executor/process/
preload.py), where a spawned worker spent ~2.5 s in ``import torch`` and ~1.5 s in its first optimizer's lazy
imports. The forkserver imports them once per Python process: every job of a sweep after the first gets warm
workers. It is started as early as possible, so that its imports overlap with the caller's: by
``python -m fedsim`` before anything else when the command line asks for ``executor=process`` (or for
``executor=auto`` on a machine with a core to spare), else when a ``ProcessExecutor`` is made. This module imports
neither torch nor the rest of fedsim (nor do the package ``__init__`` modules above it).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Sequence
from multiprocessing import forkserver
from typing import TYPE_CHECKING

from fedsim.executor.cpu_load import usable_cores

if TYPE_CHECKING:
    from multiprocessing.context import ForkServerContext

PRELOAD = ["fedsim.executor.process.preload"]
HF_PRELOAD = "fedsim.executor.process.preload_hf"  # also, for a Hugging Face model (start_early's ``hf_model``)
_started_at: float | None = None  # when this process first asked for the forkserver (time.monotonic)


def worker_context(extra_preload: Sequence[str] = ()) -> ForkServerContext:
    """The forkserver context, its server started (importing :data:`PRELOAD` in the background) if it is not yet.
    As under spawn, a forked worker imports the caller's script as ``__mp_main__`` (so a script keeps its
    experiment under ``if __name__ == "__main__":``); what a notebook defines reaches workers by value
    (fedsim/executor/process/by_value.py). A process that already runs a forkserver of its own keeps it and its
    preload list: ``extra_preload`` (more modules to import) counts only when this call starts the server."""
    global _started_at
    context = multiprocessing.get_context("forkserver")
    if _started_at is None:
        context.set_forkserver_preload([*PRELOAD, *extra_preload])
    forkserver.ensure_running()
    if _started_at is None:
        _started_at = time.monotonic()
    return context


def started_s_ago() -> float | None:
    """Seconds since this process started the forkserver (``None``: not started): its imports take ~6 CPU seconds."""
    return None if _started_at is None else time.monotonic() - _started_at


def has_core_to_spare() -> bool:
    """Whether the machine looks idle enough to start the forkserver on speculation: over the last minute other
    processes kept, on average, at most ``usable cores - 1.5`` runnable (the 1-minute load average; this process,
    just started, is hardly in it yet)."""
    try:
        return os.getloadavg()[0] <= usable_cores() - 1.5
    except OSError:
        return False


def start_early(argv: Sequence[str], hf_model: bool = False) -> None:
    """Start the forkserver now when the command line ``argv`` selects the process executor (``executor=process``,
    also in a sweep such as ``executor=serial,process``), or ``executor=auto`` while the machine has a core to
    spare (auto may then choose process after the first round, and its workers need not wait for these imports).
    ``hf_model``: the run's model is a Hugging Face one; the forkserver also imports :data:`HF_PRELOAD`."""
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if key != "executor":
            continue
        options = value.split(",")
        if "process" in options or ("auto" in options and has_core_to_spare()):
            worker_context([HF_PRELOAD] if hf_model else [])
            return
