"""The server's store of client states: versioned by round, so that any kept checkpoint can be resumed exactly.

A client's state is written as a new *version*, numbered by the round whose update carried it, when the
server commits that round (after aggregation, accepted updates only). A read returns the newest version
at or before the store's current round. A checkpoint of round r therefore only has to name r: the entries
it needs are the newest versions ≤ r, which stay on disk until no kept checkpoint needs them
(:meth:`ClientStateStore.collect`). Nothing is copied at a checkpoint, and a round costs reads and writes
for its sampled clients only, whatever the size of the federation.

Entries live in ``directory`` as ``<id // 1000>/c<id>-r<round>.state`` (checksummed, loaded with
``weights_only=True``; see :mod:`fedsim.core.checkpoint`); the file names are the manifest. ``kind="memory"``
also keeps every needed version in RAM and serves reads from there; ``kind="disk"`` keeps only the index
in RAM. Without a directory (a run that writes no checkpoints) a memory store keeps its versions in RAM
only and a disk store uses a fresh temporary directory.
"""

from __future__ import annotations

import bisect
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from fedsim.core.checkpoint import CheckpointError, read_verified, write_verified
from fedsim.core.state_values import copy_state

KINDS = ("memory", "disk")
_ENTRY = re.compile(r"^c(\d+)-r(\d+)\.state$")
_PER_FOLDER = 1000


class ClientStateStore:
    """Versioned client states; ``kind`` is ``"memory"`` or ``"disk"`` (see the module docstring)."""

    def __init__(self, kind: str = "memory", directory: str | Path | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"state_store must be 'memory' or 'disk' (got {kind!r})")
        if kind == "disk" and directory is None:
            directory = tempfile.mkdtemp(prefix="fedsim-client-state-")
        self.kind = kind
        self.directory = Path(directory) if directory is not None else None
        self.round = 0  # the round whose commit is the newest visible one
        self._versions: dict[int, list[int]] = {}  # client id -> rounds of its versions, ascending
        self._payloads: dict[tuple[int, int], dict[str, Any]] = {}  # (client, round) -> state (memory kind)
        self._superseded: set[int] = set()  # clients with more than one version: what collect() looks at
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._scan()

    def get(self, client_id: int, round_num: int | None = None) -> dict[str, Any]:
        """A private copy of the client's state as of :attr:`round`, or as of an earlier ``round_num`` whose
        versions are still kept (``{}`` if it has none yet)."""
        version = self._visible(client_id, self.round if round_num is None else min(round_num, self.round))
        if version is None:
            return {}
        return copy_state(self._load(client_id, version))

    def commit(self, round_num: int, states: dict[int, dict[str, Any]]) -> None:
        """Record ``states`` (client id → new state) as round ``round_num``'s versions and make that round
        current. A client whose state is ``{}`` and had none before costs nothing."""
        for client_id, state in sorted(states.items()):
            if not state and self._visible(client_id, round_num) is None:
                continue
            self._store(int(client_id), round_num, copy_state(state))
        self.round = round_num

    def rewind(self, round_num: int) -> None:
        """Go back to the states as of round ``round_num`` (a resume from that round's checkpoint): versions
        written after it belong to the abandoned rest of the interrupted run and are deleted, so that a round
        the resumed run does not repeat exactly (a client that fails this time) can never read one of them."""
        for client_id in sorted(self._versions):
            for version in [v for v in self._versions[client_id] if v > round_num]:
                self._remove(client_id, version)
            if not self._versions[client_id]:
                del self._versions[client_id]
            if len(self._versions.get(client_id, ())) < 2:
                self._superseded.discard(client_id)
        self.round = round_num

    def import_from(self, source: Path, round_num: int) -> None:
        """Copy in, from another run's state directory, every client's newest version ≤ ``round_num``
        (a resume from a checkpoint of another run directory)."""
        other = ClientStateStore("disk", source)
        for client_id in sorted(other._versions):
            version = other._visible(client_id, round_num)
            if version is not None:
                self._store(client_id, version, other._load(client_id, version))
        self.round = round_num

    def collect(self, needed_rounds: Iterable[int]) -> int:
        """Delete versions that no round in ``needed_rounds`` (the kept checkpoints) nor the current round
        and the one before it would read; returns how many went. Looks only at clients with several versions."""
        rounds = sorted(set(needed_rounds) | {self.round, self.round - 1})
        removed = 0
        for client_id in sorted(self._superseded):
            versions = self._versions[client_id]
            keep = {v for v in (self._visible(client_id, r) for r in rounds) if v is not None}
            for version in [v for v in versions if v not in keep]:
                self._remove(client_id, version)
                removed += 1
            if len(self._versions[client_id]) < 2:
                self._superseded.discard(client_id)
        return removed

    def manifest(self, round_num: int) -> torch.Tensor:
        """The version every client reads as of ``round_num``, as rows ``(client id, version)`` sorted by client (an
        int64 tensor): what a checkpoint of that round needs of the store, kept in the checkpoint so that a resume
        can tell a missing entry from a client that had none."""
        rows = [(c, v) for c in sorted(self._versions) if (v := self._visible(c, round_num)) is not None]
        return torch.tensor(rows, dtype=torch.int64).reshape(-1, 2)

    def problem(self, manifest: torch.Tensor, round_num: int) -> str | None:
        """Why this store cannot give back the states a checkpoint of ``round_num`` recorded in ``manifest``: the
        first entry that is missing (the store would serve an older version, or none) or does not verify, in one
        line naming its file; ``None`` when every entry is there and verifies. Reads every entry once."""
        for client_id, version in manifest.tolist():
            where = self._path(client_id, version) if self.directory is not None else f"client {client_id}"
            if self._visible(client_id, round_num) != version:
                return f"the state of client {client_id} written in round {version} ({where}) is missing"
            try:
                self._load(client_id, version)
            except CheckpointError as error:
                return str(error)
        return None

    def num_entries(self) -> int:
        """Versions held (for tests and benchmarks)."""
        return sum(len(v) for v in self._versions.values())

    def clients(self) -> list[int]:
        """Ids of the clients with at least one version."""
        return sorted(self._versions)

    # --- internals ----------------------------------------------------------------------------
    def _visible(self, client_id: int, round_num: int) -> int | None:
        versions = self._versions.get(int(client_id), [])
        index = bisect.bisect_right(versions, round_num)
        return versions[index - 1] if index else None

    def _path(self, client_id: int, version: int) -> Path:
        assert self.directory is not None
        return self.directory / f"{client_id // _PER_FOLDER:05d}" / f"c{client_id}-r{version}.state"

    def _store(self, client_id: int, version: int, state: dict[str, Any]) -> None:
        if self.directory is not None:
            path = self._path(client_id, version)
            path.parent.mkdir(exist_ok=True)
            write_verified(path, state)
        if self.kind == "memory":
            self._payloads[(client_id, version)] = state
        versions = self._versions.setdefault(client_id, [])
        if version not in versions:
            bisect.insort(versions, version)
        if len(versions) > 1:
            self._superseded.add(client_id)

    def _load(self, client_id: int, version: int) -> dict[str, Any]:
        if self.kind == "memory" and (client_id, version) in self._payloads:
            return self._payloads[(client_id, version)]
        state = read_verified(self._path(client_id, version), "client state")
        if self.kind == "memory":
            self._payloads[(client_id, version)] = state
        return state

    def _remove(self, client_id: int, version: int) -> None:
        self._versions[client_id].remove(version)
        self._payloads.pop((client_id, version), None)
        if self.directory is not None:
            self._path(client_id, version).unlink(missing_ok=True)

    def _scan(self) -> None:
        """Rebuild the index from the entry files (a resumed run); temporary files of an interrupted write go."""
        assert self.directory is not None
        for stale in self.directory.glob("*/*.tmp"):
            stale.unlink(missing_ok=True)
        for path in self.directory.glob("*/c*-r*.state"):
            match = _ENTRY.match(path.name)
            if match:
                client_id, version = int(match.group(1)), int(match.group(2))
                bisect.insort(self._versions.setdefault(client_id, []), version)
                if len(self._versions[client_id]) > 1:
                    self._superseded.add(client_id)

    def clear(self) -> None:
        """Forget every version (and delete the entry files): a fresh run in a directory used before."""
        if self.directory is not None:
            for folder in [p for p in self.directory.iterdir() if p.is_dir()]:
                shutil.rmtree(folder, ignore_errors=True)
        self._versions, self._payloads, self._superseded, self.round = {}, {}, set(), 0


def source_store(store: ClientStateStore, checkpoint: Path) -> ClientStateStore | None:
    """The store that holds the client states a resume from ``checkpoint`` reads: ``store`` itself when the checkpoint
    belongs to this run directory, else the run directory's own (None when it has none)."""
    source = checkpoint.parent / "client_state"
    if store.directory is not None and source.resolve() == store.directory.resolve():
        return store
    return ClientStateStore("disk", source) if source.is_dir() else None


def restore_states(store: ClientStateStore, checkpoint: Path, round_num: int) -> bool:
    """Make ``store`` show the clients' states as of a resumed checkpoint's round: its own entries rewound
    (returns ``True``: the checkpoint belongs to this run), or the ones it needs copied in from the run
    directory the checkpoint belongs to (``False``)."""
    source = checkpoint.parent / "client_state"
    if store.directory is not None and source.resolve() == store.directory.resolve():
        store.rewind(round_num)
        return True
    if source.is_dir():
        store.import_from(source, round_num)
    else:
        store.rewind(round_num)
    return False
