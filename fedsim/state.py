"""Client-state stores: per-client tensors that survive between rounds (e.g. SCAFFOLD's control variates).

Only the sampled clients' entries are ever read or written, so a store costs nothing for clients that
do not take part. :class:`MemoryStateStore` keeps tensors in a dict; :class:`DiskStateStore` keeps
one file per client (written atomically, read with ``weights_only=True``) for federations whose
states do not fit in memory. Both return exactly what was stored, so they give identical results.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch


class MemoryStateStore:
    """Client states in a dict, keyed by client id."""

    def __init__(self) -> None:
        self._states: dict[int, torch.Tensor] = {}

    def get(self, client_id: int) -> torch.Tensor | None:
        """The stored state of ``client_id``, or ``None`` if it never stored one."""
        return self._states.get(client_id)

    def put(self, client_id: int, state: torch.Tensor) -> None:
        self._states[client_id] = state.detach().clone()

    def __len__(self) -> int:
        return len(self._states)

    def snapshot(self) -> dict[int, torch.Tensor]:
        """Every stored state (for checkpoints)."""
        return {cid: state.clone() for cid, state in self._states.items()}

    def restore(self, states: dict[int, torch.Tensor]) -> None:
        """Replace the whole store with ``states`` (from a checkpoint)."""
        self._states = {int(cid): state.clone() for cid, state in states.items()}


class DiskStateStore:
    """Client states as ``<directory>/client-<id>.pt`` files; ``directory=None`` uses a fresh temporary one."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="fedsim-state-"))
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, client_id: int) -> Path:
        return self.directory / f"client-{int(client_id)}.pt"

    def get(self, client_id: int) -> torch.Tensor | None:
        path = self._path(client_id)
        if not path.exists():
            return None
        return torch.load(path, map_location="cpu", weights_only=True)

    def put(self, client_id: int, state: torch.Tensor) -> None:
        """Write atomically: a temporary file in the same directory, fsync, rename."""
        path = self._path(client_id)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                torch.save(state.detach().cpu().clone(), handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def __len__(self) -> int:
        return sum(1 for _ in self.directory.glob("client-*.pt"))

    def snapshot(self) -> dict[int, torch.Tensor]:
        """Every stored state (for checkpoints; this reads every file)."""
        return {int(p.stem.split("-")[1]): torch.load(p, map_location="cpu", weights_only=True) for p in self.directory.glob("client-*.pt")}

    def restore(self, states: dict[int, torch.Tensor]) -> None:
        """Replace the whole store with ``states``: files of clients not in ``states`` are removed, so a
        resumed run does not see states written after its checkpoint."""
        for path in self.directory.glob("client-*.pt"):
            if int(path.stem.split("-")[1]) not in states:
                path.unlink()
        for cid, state in states.items():
            self.put(int(cid), state)


ClientStateStore = MemoryStateStore | DiskStateStore


def make_store(kind: str, directory: str | Path | None = None) -> ClientStateStore:
    """``"memory"`` or ``"disk"`` (one file per client under ``directory``)."""
    if kind == "memory":
        return MemoryStateStore()
    if kind == "disk":
        return DiskStateStore(directory)
    raise ValueError(f"strategy.state_store must be 'memory' or 'disk' (got {kind!r})")
