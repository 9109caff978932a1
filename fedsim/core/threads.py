"""The server's thread budget: how many threads torch uses in the main process outside ``executor.fit``.

The server's own work between two ``fit`` calls (checking updates, their norms, the average, evaluation) is
many small operations. Run with torch's default, one OpenMP thread per core, it stalls as soon as anything
else uses a core: every parallel operation waits for its slowest thread, and a thread the OS has put behind
another job makes the others spin. On a 2-core machine with one core busy, a 2NN round of the process
executor took 0.22 s with 2 server threads and 0.13 s with 1, with identical weights (docs/performance.md).
Executors set their own count inside ``fit``. One thread also makes the evaluation metrics independent of
the machine's core count (a sum's rounding depends on how it is split over threads).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Inside: torch uses ``count`` intra-op threads (``None``: leave the setting alone); restored on leaving."""
    if count is None:
        yield
        return
    if count < 1:
        raise ValueError(f"server_threads must be >= 1 or null (got {count})")
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
