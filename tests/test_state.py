"""Client-state stores: memory and disk give back exactly what was stored."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedsim.state import DiskStateStore, MemoryStateStore, make_store


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_round_trip_is_exact_and_isolated(kind: str, tmp_path: Path) -> None:
    store = make_store(kind, tmp_path / "s")
    assert store.get(3) is None
    value = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    store.put(3, value)
    value.add_(1.0)  # the store kept its own copy
    got = store.get(3)
    assert torch.equal(got, torch.randn(1000, generator=torch.Generator().manual_seed(0)))
    assert len(store) == 1 and store.get(4) is None


def test_disk_store_writes_one_file_per_client_and_no_temporaries(tmp_path: Path) -> None:
    store = DiskStateStore(tmp_path)
    for cid in (5, 9, 5):
        store.put(cid, torch.full((4,), float(cid)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client-5.pt", "client-9.pt"]


def test_disk_store_refuses_pickled_objects(tmp_path: Path) -> None:
    (tmp_path / "client-1.pt").write_bytes(b"")
    torch.save({"x": object.__new__(MemoryStateStore)}, tmp_path / "client-2.pt")
    store = DiskStateStore(tmp_path)
    with pytest.raises(Exception):
        store.get(2)  # weights_only=True: an arbitrary object is never unpickled


def test_unknown_kind_names_the_field() -> None:
    with pytest.raises(ValueError, match="strategy.state_store"):
        make_store("redis")
