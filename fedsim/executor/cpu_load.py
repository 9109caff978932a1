"""How many cores this process may use, and how many of them other processes kept busy over a stretch of time.

What ``executor=auto`` sees of the machine, and what it cannot see: ``/proc/stat`` counts every CPU of the (virtual)
machine, so the cores other processes used is the machine's busy time less this process tree's own CPU time, over a
window (``steal`` counts as others' use: a hypervisor gave that time to another guest). It cannot see the demand
behind that use: ten runnable jobs on two cores and two of them both read as "2 cores busy". Usable cores are the
CPUs this process may run on (``sched_getaffinity``), capped by a cgroup v2 CPU quota (``cpu.max``) where one is
set. Off Linux (no ``/proc/stat``) nothing is measured: :meth:`CpuWindow.others_cores` returns ``None``.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (not idle, not iowait)


def usable_cores() -> float:
    """The CPUs this process may run on, capped by the cgroup's CPU quota (``cpu.max``: quota and period)."""
    cpus = float(len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else float(os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return cpus
    return cpus if quota == "max" else max(min(cpus, int(quota) / int(period)), 0.01)


def machine_busy_seconds() -> float | None:
    """CPU seconds every CPU of the machine has been busy since boot (``/proc/stat``), or ``None`` off Linux."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    return sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields)) / _CLOCK_TICKS


def own_cpu_seconds() -> float:
    """CPU seconds of this process, its reaped children and its live descendants (worker processes, the forkserver
    they are forked from), read from ``/proc``."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    parent_of, cpu_of = _processes()
    tree = {os.getpid()}
    while grown := {pid for pid, parent in parent_of.items() if parent in tree and pid not in tree}:
        tree |= grown
    return total + sum(cpu_of[pid] for pid in tree - {os.getpid()})


def _processes() -> tuple[dict[int, int], dict[int, float]]:
    """Every live process's parent and CPU seconds (empty off Linux)."""
    parent_of: dict[int, int] = {}
    cpu_of: dict[int, float] = {}
    try:
        pids = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return parent_of, cpu_of
    for pid in pids:
        try:
            rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        parent_of[pid], cpu_of[pid] = int(rest[1]), (int(rest[11]) + int(rest[12])) / _CLOCK_TICKS
    return parent_of, cpu_of


class CpuWindow:
    """A stretch of time from its creation: how long it lasted and how many cores other processes used meanwhile."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self._busy = machine_busy_seconds()
        self._own = own_cpu_seconds()

    def elapsed(self) -> float:
        """Wall seconds since the window opened."""
        return time.perf_counter() - self.began

    def others_cores(self) -> float | None:
        """Mean cores other processes kept busy since the window opened (``None`` where ``/proc/stat`` is missing):
        the machine's busy CPU time less this process tree's, over the wall time."""
        busy = machine_busy_seconds()
        if busy is None or self._busy is None:
            return None
        others = (busy - self._busy) - (own_cpu_seconds() - self._own)
        return max(others, 0.0) / max(self.elapsed(), 1e-3)
