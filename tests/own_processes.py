"""Processes a test started, told apart from every other process on the machine (another fedsim run, a second copy
of the suite, anyone's multiprocessing workers or Ray): the test starts its subprocess with a unique tag in the
environment, which every descendant inherits (process workers, forkservers, Ray's daemons and actors), and looks
only for live processes carrying that tag. A recycled pid belongs to a process without the tag."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

TAG_VARIABLE = "FEDSIM_TEST_TAG"


def tagged_environment(tag: str) -> dict[str, str]:
    """This process's environment plus ``FEDSIM_TEST_TAG=tag``, for a subprocess whose descendants we watch."""
    return {**os.environ, TAG_VARIABLE: tag}


def new_tag() -> str:
    return uuid.uuid4().hex


def live_tagged(tag: str) -> dict[int, str]:
    """Live (not zombie) processes whose environment holds ``FEDSIM_TEST_TAG=tag``: pid -> command line."""
    marker = f"{TAG_VARIABLE}={tag}\0".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        proc = Path("/proc", entry)
        try:
            if marker not in (proc / "environ").read_bytes() + b"\0":
                continue
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            found[int(entry)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # exited meanwhile, or not ours to read
            continue
    return found
