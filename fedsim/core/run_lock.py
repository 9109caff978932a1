"""One run, one directory: an exclusive lock on every directory a run writes.

A run (the command line's run directory, a sweep's directory, a :class:`~fedsim.observe.run_logger.RunLogger`'s
directory, a :class:`~fedsim.server.Server`'s checkpoint directory) takes ``<directory>/.fedsim.lock`` with
``flock(LOCK_EX)`` before it writes anything there, and writes into the file who holds it (pid, host, since when).
A second process that asks for the same directory is refused with :class:`RunDirectoryInUse`, whose one-line
message names the holder. The operating system drops an ``flock`` when its process dies, however it dies, so a run
killed with SIGKILL leaves no stale lock: the file may stay behind with the dead holder's details, and the next run
simply takes it. A run that ends normally removes the file.

Within one process the lock is re-entrant: the command line's run, its logger and its server share one lock, and
a notebook that builds a second :class:`~fedsim.server.Server` on the directory of one it has not run is not
refused (a process is trusted to know its own runs).

What it cannot see: a filesystem on which ``flock`` is not honoured across machines (NFS mounted with ``nolock``,
Lustre without ``-o flock``, some FUSE and SMB mounts). Where the call fails outright, the run goes on with one
warning; where the filesystem silently keeps locks per machine, two runs on two machines are not kept apart.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; runs are not guarded there
    fcntl = None  # type: ignore[assignment]  # (the module is absent on Windows; every use checks for None)

log = logging.getLogger("fedsim")

LOCK_NAME = ".fedsim.lock"
# errors that mean "this filesystem does not do flock", not "someone holds it"
_UNSUPPORTED = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}
_RETRY_S = 0.5  # how long a refused request keeps trying: a probe (fedsim.report) holds the file for microseconds


@dataclass(frozen=True)
class Holder:
    """Who holds a directory, as its lock file says (``None`` fields: the file was empty or unreadable)."""

    pid: int | None = None
    host: str | None = None
    since: str | None = None

    def describe(self) -> str:
        """E.g. ``pid 4242 on host node7, since 2026-12-06 04:10:11 UTC``."""
        if self.pid is None:
            return "holder unknown"
        return f"pid {self.pid} on host {self.host}, since {self.since}"


class RunDirectoryInUse(RuntimeError):
    """Another process holds the directory a run was about to write; ``str()`` is one line naming the directory and
    the holder. Raised before anything is written there."""

    def __init__(self, directory: Path, holder: Holder) -> None:
        super().__init__(
            f"{directory} is in use by another run ({holder.describe()}); wait for that run to end, or give this "
            "run another directory (hydra.run.dir, or the sweep's hydra.sweep.dir)"
        )
        self.directory = directory
        self.holder = holder


def read_holder(directory: str | Path) -> Holder:
    """The holder details written in ``directory``'s lock file (an empty :class:`Holder` when there are none)."""
    try:
        fields = json.loads((Path(directory) / LOCK_NAME).read_text(encoding="utf-8"))
        return Holder(int(fields["pid"]), str(fields["host"]), str(fields["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return Holder()


def is_held(directory: str | Path) -> bool:
    """Whether a live process holds ``directory``'s lock (this one included). A shared, non-blocking probe that is
    released at once; a run asking for the lock at that instant retries (:data:`_RETRY_S`)."""
    if fcntl is None:
        return False
    try:
        fd = os.open(Path(directory) / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


class _Lock:
    """The process's lock on one directory: the open, flocked lock file (``fd`` None where the filesystem does not
    lock) and how many leases share it."""

    def __init__(self, directory: Path, fd: int | None) -> None:
        self.directory, self.fd, self.leases = directory, fd, 0

    def drop(self) -> None:
        """Remove the lock file (while still holding it, so that no one takes a file that is going away) and let go."""
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            if _same_file(self.fd, self.directory / LOCK_NAME):
                os.unlink(self.directory / LOCK_NAME)
        os.close(self.fd)
        self.fd = None


_held: dict[Path, _Lock] = {}  # this process's locks, by resolved directory


class Lease:
    """One claim on a directory's lock (:func:`hold`). :meth:`release` gives it back; the lock goes when its last
    lease does. Releasing twice, or letting the lease be garbage-collected, is safe."""

    def __init__(self, lock: _Lock) -> None:
        self._lock: _Lock | None = lock
        lock.leases += 1

    @property
    def directory(self) -> Path:
        """The directory this lease holds (resolved)."""
        assert self._lock is not None, "released"
        return self._lock.directory

    def release(self) -> None:
        """Give the lease back; the last one removes the lock file and unlocks."""
        lock, self._lock = self._lock, None
        if lock is None:
            return
        lock.leases -= 1
        if lock.leases == 0:
            _held.pop(lock.directory, None)
            lock.drop()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit, modules may be gone already
            self.release()


def hold(directory: str | Path) -> Lease:
    """A lease on ``directory`` (created if missing): the first in this process takes the exclusive lock, later
    ones share it. Raises :class:`RunDirectoryInUse` when another process holds it (tried for :data:`_RETRY_S`)."""
    path = Path(directory).resolve()
    lock = _held.get(path)
    if lock is None:
        path.mkdir(parents=True, exist_ok=True)
        lock = _Lock(path, _take(path))
        _held[path] = lock
    return Lease(lock)


def _take(directory: Path) -> int | None:
    """The open lock file of ``directory``, locked and naming this process; None where flock is not supported."""
    if fcntl is None:
        return None
    deadline = time.monotonic() + _RETRY_S
    while True:
        fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() > deadline:
                raise RunDirectoryInUse(directory, read_holder(directory)) from None
            time.sleep(0.02)
            continue
        except OSError as error:
            os.close(fd)
            if error.errno not in _UNSUPPORTED:
                raise
            log.warning("cannot lock %s (%s): this run does not guard its directory", directory, error.strerror)
            return None
        if _same_file(fd, directory / LOCK_NAME):  # not a file its holder removed between our open and flock
            _write_holder(fd)
            return fd
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        mine, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _write_holder(fd: int) -> None:
    since = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since}) + "\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode("utf-8"), 0)
