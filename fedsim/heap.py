"""Keep freed heap memory in the process while a vectorised executor trains (glibc's ``mallopt``).

A vectorised training step allocates tensors as large as ``chunk × parameters`` (the McMahan CNN's first dense
layer: 6.4 MB per client, 128 MB for 20 clients) and frees them before the next step. glibc serves every
allocation above 32 MiB with a fresh ``mmap`` and gives it back to the kernel on ``free``, so each step
page-faults all of that memory again. On the 2-core AMD EPYC VM (a Firecracker guest, where a page fault is
expensive) that made a weight gradient's batched product 2.5x slower than the product itself, and a vmap round
of the CNN 1.13x slower than training the same clients one after another (docs/performance.md, "vmap and
freed memory"). PyTorch's performance guide recommends swapping in jemalloc or tcmalloc for the same reason;
this needs no preloaded library: inside :func:`retained_heap` glibc never uses ``mmap`` for a ``malloc`` and
keeps up to 2 GiB of free memory at the heap's top, so the next step reuses the pages already mapped.

The cost is memory: while it is active the process keeps its peak heap. On leaving, glibc's limits are set
back to its defaults and :func:`malloc_trim` returns the free memory to the kernel (glibc's *dynamic* mmap
threshold, which ``mallopt`` switches off, stays off: allocations above the threshold reached so far are still
mmapped). Memory layout does not change any number: PyTorch aligns every CPU tensor to 64 bytes either way.
Elsewhere than glibc (macOS, musl) it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
from collections.abc import Iterator

# <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
GLIBC_DEFAULT_MMAP_MAX = 65536
GLIBC_DEFAULT_TRIM_THRESHOLD = 128 * 1024
RETAINED_TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int


def _glibc() -> ctypes.CDLL | None:
    """The C library if it is glibc (it has ``gnu_get_libc_version``), else ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


@contextlib.contextmanager
def retained_heap() -> Iterator[bool]:
    """Inside: freed memory stays in the process (yields ``True``; ``False`` where this is not glibc).

    Not re-entrant by count: a nested use leaves the outer one's setting in place until the outer one ends."""
    libc = _glibc()
    if libc is None or _depth[0] > 0:
        _depth[0] += 1
        try:
            yield libc is not None
        finally:
            _depth[0] -= 1
        return
    _depth[0] += 1
    libc.mallopt(M_MMAP_MAX, 0)
    libc.mallopt(M_TRIM_THRESHOLD, RETAINED_TRIM_THRESHOLD)
    try:
        yield True
    finally:
        _depth[0] -= 1
        libc.mallopt(M_MMAP_MAX, GLIBC_DEFAULT_MMAP_MAX)
        libc.mallopt(M_TRIM_THRESHOLD, GLIBC_DEFAULT_TRIM_THRESHOLD)
        libc.malloc_trim(0)


_depth = [0]  # how many retained_heap() blocks are open in this process
