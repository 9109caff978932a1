"""Why a Ray actor did not start or did not answer, in one line worded like the process executor's."""

from __future__ import annotations

import contextlib
import re
from typing import Any

from fedsim.executor.base import POSSIBLY_OOM

_RAY_OOM = re.compile(r"running low on memory|OOM kill reason|NODE_OUT_OF_MEMORY", re.IGNORECASE)


def kill_quietly(ray: Any, actor: Any) -> None:
    with contextlib.suppress(Exception):  # already dead or Ray already down
        ray.kill(actor, no_restart=True)


def start_failure(ray: Any, name: str, error: Exception) -> tuple[str, bool]:
    """One line saying why actor ``name`` did not start, and whether another start may succeed: not when its
    constructor raised (a module it needs is missing, the workload cannot be built), yes when it was killed."""
    text = str(error)
    cause = getattr(error, "cause", None) or getattr(error, "__cause__", None)
    if "creation task" in text and isinstance(cause, Exception):
        return (
            f"Ray worker {name} could not start: {type(cause).__name__}: {str(cause).strip().splitlines()[-1]}",
            False,
        )
    if "creation task" in text:
        lines = [line for line in text.splitlines() if line.strip()]
        return f"Ray worker {name} could not start: {lines[-1].strip()}", False
    return f"{death_reason(ray, name, error)} before it could train", True


def death_reason(ray: Any, name: str, error: Exception) -> str:
    """One line saying why an actor's task did not come back, worded like the process executor's."""
    # Ray's memory monitor makes the task raise OutOfMemoryError (checked with a real kill, Ray 2.60).
    # Ray's generic death message lists "the OOM killer" only as a *possible* cause: a SIGKILL from the
    # OS OOM killer, any other SIGKILL and a segfault all read the same (exit type SYSTEM_ERROR).
    text = str(error)
    if isinstance(error, getattr(ray.exceptions, "OutOfMemoryError", ())) or _RAY_OOM.search(text):
        return f"Ray worker {name} was killed by Ray's memory monitor: out of memory"
    if "node has died" in text:
        return f"Ray worker {name} was lost with its node (Ray: the actor's node has died)"
    if "SYSTEM_ERROR" in text:
        return f"Ray worker {name} was killed or crashed ({POSSIBLY_OOM}; Ray does not say which signal)"
    return f"Ray worker {name} died ({type(error).__name__})"
