"""The command line's side of "one run, one directory" (:mod:`fedsim.core.run_lock`).

Hydra writes into a run's directory before it calls fedsim (its ``.hydra/`` files, and ``run.log`` once there is
a line to log), so the lock is taken earlier, by a Hydra callback that ``conf/config.yaml`` registers
(``hydra.callbacks.fedsim_dir_lock``): :meth:`DirectoryLockCallback.on_run_start` locks a single run's directory and
:meth:`~DirectoryLockCallback.on_multirun_start` a sweep's, before Hydra creates either. A sweep's jobs then lock
their own directories when they start (the run's :class:`~fedsim.observe.run_logger.RunLogger` does, and
:func:`command_line_lease` before it), in the sweep's process or, under the submitit or Ray launchers, in the job's.
Every lease the command line took is given back when it returns (:func:`release_command_line_leases`), however it
returns.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from fedsim.cli.hydra_entry import fail
from fedsim.core.run_lock import Lease, RunDirectoryInUse, hold

log = logging.getLogger("fedsim")
_leases: list[Lease] = []  # taken by this process's command line, released when it returns


def command_line_lease(directory: str | Path) -> Lease:
    """:func:`fedsim.core.run_lock.hold`, the lease kept until the command line returns."""
    lease = hold(directory)
    _leases.append(lease)
    return lease


def release_command_line_leases() -> None:
    """Give back every lease the command line took (the callbacks' and the jobs')."""
    while _leases:
        _leases.pop().release()


def _resolved_dir(config: DictConfig, key: str) -> Path | None:
    """``config``'s ``key`` (``hydra.run.dir`` or ``hydra.sweep.dir``) as Hydra will resolve it (its ``${now:}``
    is cached, so the same time), or None when it cannot be resolved this early; the job then locks its directory
    itself, after Hydra's own files."""
    previous = HydraConfig.instance().cfg
    try:
        HydraConfig.instance().set_config(config)
        value = OmegaConf.select(config, key)
    except Exception as error:  # an interpolation only the job's context resolves
        log.debug("%s not resolvable before the run (%s); the run locks its directory when it starts", key, error)
        return None
    finally:
        HydraConfig.instance().cfg = previous
    return Path(str(value)).absolute() if value is not None else None


def _lock_or_exit(directory: Path | None) -> None:
    """Take the command line's lease on ``directory``; a directory another process holds ends the command with one
    line and exit status 2. (It exits rather than raises: Hydra turns a callback's exception into a warning and goes
    on to write the directory.)"""
    if directory is None:
        return
    try:
        command_line_lease(directory)
    except RunDirectoryInUse as error:
        fail(str(error), 2)
    except OSError:
        # a directory that cannot be created or written (a name too long, a full disk, a read-only file system):
        # Hydra's own mkdir or write fails next, in one line naming its file (fedsim.cli.hydra_entry); raised here,
        # Hydra would print a warning about this callback before it
        pass


class DirectoryLockCallback(Callback):
    """Locks a run's or a sweep's directory before Hydra writes into it; a held one stops the command in one line
    naming the holder (:class:`~fedsim.core.run_lock.RunDirectoryInUse`)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Lock ``hydra.run.dir``."""
        _lock_or_exit(_resolved_dir(config, "hydra.run.dir"))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Lock ``hydra.sweep.dir``: a second sweep into it is refused before its first job."""
        _lock_or_exit(_resolved_dir(config, "hydra.sweep.dir"))
