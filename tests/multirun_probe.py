"""A Hydra callback for tests/cli/test_multirun_leaks.py: after every multirun job it appends one JSON line
describing the launcher process (open fds, child and grandchild processes, live fedsim objects, SIGINT handler) to
``out``."""

from __future__ import annotations

import gc
import json
import os
import signal
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

WATCHED = ("Server", "RunLogger", "RunResult", "FederatedData", "SerialExecutor", "ProcessExecutor")


def _processes() -> dict[int, tuple[int, str, str]]:
    """Every process of this machine: pid -> (parent pid, state letter, command line)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            found[int(stat.parent.name)] = (int(fields[1]), fields[0], command)
        except (OSError, IndexError, ValueError):
            pass  # exited meanwhile
    return found


def child_commands() -> list[str]:
    """Command lines of the processes (alive or zombie) whose parent is this process."""
    return [command for parent, _, command in _processes().values() if parent == os.getpid()]


def grandchild_commands() -> list[str]:
    """Command lines of the live processes whose parent is a child of this process: process workers, which
    multiprocessing's forkserver (a child) forks, so that they are not children of this process themselves."""
    processes = _processes()
    children = {pid for pid, (parent, _, _) in processes.items() if parent == os.getpid()}
    return [command for parent, state, command in processes.values() if parent in children and state != "Z"]


def live_fedsim_objects() -> dict[str, int]:
    """Instances of fedsim's run-scoped classes still alive after a full garbage collection."""
    gc.collect()
    counts = dict.fromkeys(WATCHED, 0)
    for obj in gc.get_objects():
        cls = type(obj)
        if cls.__name__ in counts and str(cls.__module__).startswith("fedsim"):
            counts[cls.__name__] += 1
    return counts


class Probe(Callback):
    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self.sigint_before = _name(signal.getsignal(signal.SIGINT))  # before any job (a shell may start us ignoring it)

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        handler = signal.getsignal(signal.SIGINT)
        record = {
            "fds": len(os.listdir("/proc/self/fd")),
            "children": child_commands(),
            "grandchildren": grandchild_commands(),
            "live": live_fedsim_objects(),
            "sigint": _name(handler),
            "sigint_before": self.sigint_before,
            "status": str(job_return.status),
        }
        with open(self.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def _name(handler: Any) -> str:
    return getattr(handler, "__qualname__", str(handler))
