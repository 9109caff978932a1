"""A run that cannot be built leaves its directory as it found it.

Building a server opens the run's files before the last checks have run: the logger creates ``metrics.jsonl``
and a TensorBoard event file, the checkpoint store its directory, an attack its ``malicious.json``. When a check
after that refuses the configuration (DP with the simulated clock, Krum under DP, a failed resume...), those
empty files would stay behind, and ``fedsim.report`` would list the refused configuration as an unfinished run.
:func:`removing_new_files` removes what appeared under fedsim's own names in the run directory while it was
building (:data:`OWN`); anything that was there before (a resumed run's metrics and checkpoints) and anything under
another name (Hydra's files, whatever else shares the directory) is left alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger("fedsim")

# What a run writes at the top of its directory (a tracker's mlruns/ or wandb/ only once the run starts).
OWN = (
    "checkpoints",
    "tensorboard",
    "metrics.jsonl",
    "client_eval",
    "malicious.json",
    "resume_changes.jsonl",
    "summary.json",
    "tokenizer.json",
)


@contextlib.contextmanager
def removing_new_files(run_dir: str | Path | None) -> Iterator[list[Callable[[], None]]]:
    """Inside, build the run, appending to the yielded list what must be closed before its files can go (the
    logger's ``close``). If the build raises: call those, remove every file and directory that appeared under
    fedsim's own names in ``run_dir`` meanwhile (and ``run_dir`` itself if it is new and now empty), and let the
    error through."""
    closers: list[Callable[[], None]] = []
    before = _paths(Path(run_dir)) if run_dir is not None else set()
    try:
        yield closers
    except BaseException:
        for close in closers:
            with contextlib.suppress(Exception):  # the build's own error is the one to report
                close()
        if run_dir is not None:
            _remove_new(Path(run_dir), before)
        raise


def _paths(root: Path) -> set[Path]:
    """``root`` (if it exists) and every file and directory under fedsim's own names in it."""
    found = {root} if root.exists() else set()
    for name in OWN:
        top = root / name
        if top.exists() or top.is_symlink():
            found.add(top)
        if top.is_dir() and not top.is_symlink():
            for folder, dirs, files in os.walk(top):
                found.update(Path(folder) / entry for entry in dirs + files)
    return found


def _remove_new(root: Path, before: set[Path]) -> None:
    """Remove what is under ``root``'s own names (and ``root``) now and was not in ``before``: deepest first, so a new
    directory goes after its files; a directory that still holds something else stays."""
    new = sorted(_paths(root) - before, key=lambda p: len(p.parts), reverse=True)
    for path in new:
        try:
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()
        except OSError as error:  # not empty (an old file inside), or already gone: leave it
            log.debug("left %s after a failed build: %s", path, error)
