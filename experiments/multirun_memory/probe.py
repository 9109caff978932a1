"""A Hydra callback that samples the launcher process after every multirun job (``/proc`` only, no psutil).

Enable it on the command line (with this folder on ``PYTHONPATH``)::

    +hydra.callbacks.probe._target_=probe.Probe +hydra.callbacks.probe.out=samples.jsonl
"""

from __future__ import annotations

import ctypes
import gc
import json
import logging
import os
import signal
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

WATCHED = ("Server", "RunLogger", "SummaryWriter", "FederatedData", "ProcessExecutor", "FileHandler")


def proc_status() -> dict[str, int]:
    """VmRSS / RssAnon (KiB) and Threads of this process."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {
        "rss_kib": int(fields["VmRSS"].split()[0]),
        "rss_anon_kib": int(fields["RssAnon"].split()[0]),
        "threads": int(fields["Threads"]),
    }


def children() -> list[str]:
    """Command lines (shortened) of the live or zombie processes whose parent is this one."""
    me, found = str(os.getpid()), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[1] == me:
                found.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
        except (OSError, IndexError):
            pass
    return found


def type_counts() -> Counter[str]:
    """Live objects tracked by the garbage collector, by type (``module.qualname``), after a full collection."""
    gc.collect()
    return Counter(f"{type(obj).__module__}.{type(obj).__qualname__}" for obj in gc.get_objects())


def live_objects(types: Counter[str]) -> dict[str, int]:
    """How many instances of the watched classes are alive, and all tracked objects."""
    counts = {name: sum(n for key, n in types.items() if key.rsplit(".", 1)[-1] == name) for name in WATCHED}
    counts["gc_objects"] = sum(types.values())
    return counts


def malloc_trim() -> bool:
    """Hand glibc's free heap memory back to the OS (``malloc_trim(0)``); False where there is no glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


def sample(job: int, with_types: bool = False, trim: bool = False) -> dict[str, Any]:
    """One record: memory, fds, threads, child processes, live fedsim objects, logging handlers, SIGINT handler.
    With ``trim``, also the RSS after ``malloc_trim(0)``: what is left once freed memory is handed back."""
    types = type_counts()
    kids = children()
    handler = signal.getsignal(signal.SIGINT)
    record = {
        "job": job,
        **proc_status(),
        "fds": len(os.listdir("/proc/self/fd")),
        "children": len(kids),
        "child_cmds": kids,
        **live_objects(types),
        "root_handlers": len(logging.getLogger().handlers),
        "sigint_handler": getattr(handler, "__qualname__", str(handler)),
    }
    if trim and malloc_trim():
        record["rss_trimmed_kib"] = proc_status()["rss_kib"]
    return {**record, "types": dict(types)} if with_types else record


class Probe(Callback):
    """Appends one JSON line per finished job (and one before the first) to ``out``; ``types``: with the
    count of live objects of every type (for attributing growth);
    ``trace_from``: trace Python allocations and record the heap growth since job ``trace_from``;
    ``trim``: also sample the RSS after ``malloc_trim(0)``."""

    def __init__(self, out: str, types: bool = False, trace_from: int = -1, trim: bool = False) -> None:
        self.out, self.types, self.trace_from, self.trim = Path(out), types, trace_from, trim
        self.jobs = 0
        self.baseline: tracemalloc.Snapshot | None = None

    def _write(self, record: dict[str, Any]) -> None:
        with open(self.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        self._write(sample(-1, self.types, self.trim))

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        record = sample(self.jobs, self.types, self.trim)
        if self.trace_from >= 0 and self.jobs == self.trace_from:
            tracemalloc.start(1)  # from here on: tracing everything from the start slows a run down 10x
            self.baseline = tracemalloc.take_snapshot()
        elif self.baseline is not None:
            record["traced_growth"] = heap_growth(self.baseline, tracemalloc.take_snapshot())
        self._write(record)
        self.jobs += 1


def heap_growth(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, top: int = 10) -> list[tuple[str, int, int]]:
    """Python-heap growth since ``before`` by allocating line: (where, KiB, blocks), largest first, and the total."""
    stats = after.compare_to(before, "lineno")
    rows = [
        (
            f"{s.traceback[0].filename.split('site-packages/')[-1]}:{s.traceback[0].lineno}",
            s.size_diff // 1024,
            s.count_diff,
        )
        for s in stats[:top]
    ]
    return [("total", sum(s.size_diff for s in stats) // 1024, sum(s.count_diff for s in stats)), *rows]
