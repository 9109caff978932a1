"""Checkpoints: atomic writes, verified loads, fallback to the last good one.

A checkpoint file is ``MAGIC | sha256(body) | body`` where ``body`` is a ``torch.save`` of a dict of
tensors and plain values. Writing goes to a temporary file in the same directory, is fsynced and
renamed into place, so a crash leaves either the old set of checkpoints or the new one, never a half
file under a checkpoint's name. Loading verifies the checksum first and then unpickles with
``weights_only=True``, so a corrupt file is detected and a tampered one can never run code.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import torch

from fedsim.core.storage import naming_write_errors, write_remedy

MAGIC = b"FEDSIMCK1\n"
_DIGEST = 32
_PROBE_BYTES = 4096  # one page: a disk without room for it is full
_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read back (at import, before any thread runs) for the mode of plain files
log = logging.getLogger("fedsim")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (missing, corrupt, tampered or from another run)."""


def checkpoint_path(directory: Path, round_num: int) -> Path:
    return directory / f"round-{round_num:06d}.ckpt"


def save_checkpoint(directory: str | Path, round_num: int, state: dict[str, Any], *, keep: int = 3) -> Path:
    """Write ``state`` as the checkpoint of ``round_num`` and keep only the newest ``keep`` checkpoints."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("round-*.ckpt*.tmp"):  # left by a write that a crash interrupted
        stale.unlink(missing_ok=True)
    path = checkpoint_path(directory, round_num)
    write_verified(path, state)
    for old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return path


def check_writable(run_dir: str | Path) -> None:
    """Refuse, before any work, a run directory whose ``checkpoints/`` cannot be created or written, or that has
    no room for a small probe file (a full disk)."""
    checkpoints = Path(run_dir) / "checkpoints"
    try:
        checkpoints.mkdir(parents=True, exist_ok=True)
        probe = checkpoints / ".write-test"
        try:
            with open(probe, "wb") as handle:
                handle.write(bytes(_PROBE_BYTES))
        finally:
            probe.unlink(missing_ok=True)
    except FileExistsError:
        raise CheckpointError(
            f"{checkpoints} exists and is not a directory; move it away or choose another hydra.run.dir"
        ) from None
    except OSError as error:
        raise CheckpointError(
            f"cannot write checkpoints into {checkpoints}: {error.strerror}; "
            f"{write_remedy(error)} or choose another hydra.run.dir"
        ) from None


def resume_hint(run_dir: str | Path, error: OSError, resumed_from: str | Path | None = None) -> str:
    """After a write failed mid-run: which checkpoint is intact and how to continue (``resume=``)."""
    remedy = write_remedy(error, run_dir)
    kept = list_checkpoints(Path(run_dir) / "checkpoints")
    if kept:
        return (
            f"the checkpoint of round {_round_of(kept[-1])} ({kept[-1]}) is intact: {remedy}, "
            f"then continue with resume={run_dir}"
        )
    if resumed_from is not None:
        return f"no new checkpoint was written: {remedy}, then continue with resume={resumed_from}"
    return f"no checkpoint was written: {remedy}, then run again"


def save_if_missing(directory: str | Path, round_num: int, state: dict[str, Any], *, keep: int = 3) -> Path | None:
    """After a run stopped on an error: write ``state`` as round ``round_num``'s checkpoint unless that file is
    there already. A failure to write it is only logged, so that the error that stopped the run is the one
    the user sees."""
    if checkpoint_path(Path(directory), round_num).exists():
        return None
    try:
        path = save_checkpoint(directory, round_num, state, keep=keep)
    except Exception as error:  # noqa: BLE001 - never hide the error that stopped the run
        log.warning("could not write the checkpoint of round %d after the error: %s", round_num, error)
        return None
    log.info("round %d: checkpoint %s (the last round before the error)", round_num, path)
    return path


def write_verified(path: Path, obj: Any, *, durable: bool = True) -> None:
    """Write ``MAGIC | sha256 | torch.save(obj)`` to ``path`` atomically (temporary file, rename); with
    ``durable`` also fsync the file and its directory, so it survives a power cut once this returns.
    A failed write (:class:`~fedsim.core.errors.RunWriteError`, naming ``path``) leaves what was there before and no
    temporary file."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    body = buffer.getvalue()
    write_atomic(path, MAGIC + hashlib.sha256(body).digest() + body, durable=durable)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically: a failed write keeps the previous contents. The file gets
    the permissions a plain ``open(path, "w")`` would give it."""
    write_atomic(path, text.encode("utf-8"), durable=False, mode=0o666 & ~_UMASK)


def write_atomic(path: Path, data: bytes, *, durable: bool = True, mode: int | None = None) -> None:
    """Write ``data`` to a temporary file next to ``path`` and rename it into place; an :class:`OSError` becomes
    a :class:`~fedsim.core.errors.RunWriteError` naming ``path``, with the temporary file removed. ``mode``: the
    file's permissions (default: only the owner's, as ``tempfile.mkstemp`` makes it)."""
    with naming_write_errors(path):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                if durable:
                    os.fsync(handle.fileno())
            os.replace(tmp, path)
            if durable:
                _fsync_directory(path.parent)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Verify and load one checkpoint; :class:`CheckpointError` names the file and the problem."""
    return read_verified(Path(path), "checkpoint")


def read_verified(path: Path, what: str) -> Any:
    """Read what :func:`write_verified` wrote: the checksum first, then ``torch.load(weights_only=True)``;
    :class:`CheckpointError` names the file (``what``: "checkpoint", "client state") and the problem."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CheckpointError(f"cannot read {what} {path}: {error.strerror}") from None
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + _DIGEST:
        raise CheckpointError(f"{path} is not a fedsim {what} (or is truncated)")
    digest, body = data[len(MAGIC) : len(MAGIC) + _DIGEST], data[len(MAGIC) + _DIGEST :]
    if hashlib.sha256(body).digest() != digest:
        raise CheckpointError(f"{path} is corrupt: its checksum does not match its contents")
    try:
        return torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, EOFError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(
            f"refusing to load {path}: it holds something other than tensors and plain values ({first_line})"
        ) from None


def _round_of(path: Path) -> int:
    return int(path.stem.split("-")[1])


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Checkpoint files in ``directory``, oldest round first."""
    directory = Path(directory)
    return sorted(directory.glob("round-*.ckpt")) if directory.is_dir() else []


def drop_checkpoints_after(directory: str | Path, round_num: int) -> list[Path]:
    """Delete the checkpoints of rounds after ``round_num`` in ``directory`` (a resume from an older one
    abandons them); returns what was deleted."""
    later = [path for path in list_checkpoints(directory) if _round_of(path) > round_num]
    for path in later:
        path.unlink(missing_ok=True)
    return later


def load_latest(directory: str | Path) -> tuple[Path, dict[str, Any]]:
    """The newest checkpoint that verifies; a bad newer one is skipped with a warning."""
    candidates = list_checkpoints(directory)
    if not candidates:
        raise CheckpointError(f"no checkpoint (round-*.ckpt) under {directory}")
    problems = []
    for path in reversed(candidates):
        try:
            return path, load_checkpoint(path)
        except CheckpointError as error:
            log.warning("skipping checkpoint: %s", error)
            problems.append(str(error))
    raise CheckpointError(f"no usable checkpoint under {directory}: {problems[0]}")


def resolve(target: str | Path) -> tuple[Path, dict[str, Any]]:
    """A checkpoint file, a checkpoints directory or a run directory (holding ``checkpoints/``)."""
    target = Path(target)
    if target.is_file():
        return target, load_checkpoint(target)
    if (target / "checkpoints").is_dir():
        target = target / "checkpoints"
    return load_latest(target)


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
