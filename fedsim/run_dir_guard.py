"""A run that cannot be built leaves its directory as it found it.

Building a server opens the run's files before the last checks have run: the logger creates ``metrics.jsonl``
and a TensorBoard event file, the checkpoint store its directory, an attack its ``malicious.json``. When a check
after that refuses the configuration (DP with the simulated clock, Krum under DP, a failed resume...), those
empty files would stay behind, and ``fedsim.report`` would list the refused configuration as an unfinished run.
:func:`removing_new_files` removes what appeared in the run directory while it was building; anything that was
there before (Hydra's own files, a resumed run's metrics and checkpoints) is left alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger("fedsim")


@contextlib.contextmanager
def removing_new_files(run_dir: str | Path | None) -> Iterator[list[Callable[[], None]]]:
    """Inside, build the run, appending to the yielded list what must be closed before its files can go (the
    logger's ``close``). If the build raises: call those, remove every file and directory that appeared under
    ``run_dir`` meanwhile, and let the error through."""
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
    """Every file and directory under ``root`` (``root`` itself included, if it exists)."""
    found = {root} if root.exists() else set()
    for folder, dirs, files in os.walk(root):
        found.update(Path(folder) / name for name in dirs + files)
    return found


def _remove_new(root: Path, before: set[Path]) -> None:
    """Remove what is under ``root`` now and was not in ``before``: files first, then the new directories, deepest
    first (a directory that still holds an old file stays)."""
    new = sorted(_paths(root) - before, key=lambda p: len(p.parts), reverse=True)
    for path in new:
        try:
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()
        except OSError as error:  # not empty (an old file inside), or already gone: leave it
            log.debug("left %s after a failed build: %s", path, error)
