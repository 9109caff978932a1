"""ClientStateStore: versions by round, private copies, collection of what no checkpoint needs, both kinds alike."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedsim.client.state import ClientStateStore
from fedsim.core.checkpoint import CheckpointError
from fedsim.core.state_values import copy_state, state_problem, states_equal


def _state(value: float) -> dict:
    return {"w": torch.full((3,), value), "n": int(value), "tags": ["a", {"b": 1.5}]}


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_reads_see_the_newest_version_up_to_the_current_round(kind: str, tmp_path: Path) -> None:
    store = ClientStateStore(kind, tmp_path / "s")
    assert store.get(7) == {}
    store.commit(1, {7: _state(1.0)})
    store.commit(2, {8: _state(2.0)})
    store.commit(3, {7: _state(3.0)})
    assert states_equal(store.get(7), _state(3.0)) and states_equal(store.get(8), _state(2.0))
    assert states_equal(store.get(7, round_num=2), _state(1.0))
    store.rewind(2)  # a resume from round 2's checkpoint: round 3's version belongs to an abandoned run
    assert states_equal(store.get(7), _state(1.0)) and store.num_entries() == 2
    store.commit(3, {8: _state(4.0)})  # the resumed round 3 does not train client 7: it must not see the old r3
    assert states_equal(store.get(7), _state(1.0))
    store.rewind(0)
    assert store.get(7) == {} and store.get(8) == {} and store.num_entries() == 0


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_a_task_gets_a_private_copy(kind: str, tmp_path: Path) -> None:
    store = ClientStateStore(kind, tmp_path / "s")
    original = _state(1.0)
    store.commit(1, {0: original})
    original["w"].add_(100)  # the caller's object changes after the commit
    copy = store.get(0)
    copy["w"].add_(10)
    copy["tags"][1]["b"] = 0
    assert states_equal(store.get(0), _state(1.0))


def test_an_empty_state_of_a_client_without_one_writes_nothing(tmp_path: Path) -> None:
    store = ClientStateStore("memory", tmp_path / "s")
    store.commit(1, {c: {} for c in range(50)})
    assert store.num_entries() == 0 and store.round == 1
    assert not list((tmp_path / "s").rglob("*.state"))
    store.commit(2, {3: _state(1.0)})
    store.commit(3, {3: {}})  # a client that clears its state gets an empty version
    assert store.get(3) == {} and store.num_entries() == 2


def test_collect_keeps_exactly_what_kept_checkpoints_and_the_last_rounds_read(tmp_path: Path) -> None:
    store = ClientStateStore("disk", tmp_path / "s")
    for r in range(1, 7):
        store.commit(r, {0: _state(float(r))} if r % 2 else {1: _state(float(r))})  # client 0: rounds 1,3,5; 1: 2,4,6
    assert store.num_entries() == 6
    removed = store.collect(needed_rounds=[2])  # a kept checkpoint of round 2, and rounds 6 and 5
    assert removed == 1  # only c0-r3: round 2 reads c0-r1, rounds 5 and 6 read c0-r5 and c1-r4 / c1-r6
    files = sorted(p.name for p in (tmp_path / "s").rglob("*.state"))
    assert files == ["c0-r1.state", "c0-r5.state", "c1-r2.state", "c1-r4.state", "c1-r6.state"]
    assert states_equal(store.get(0, round_num=2), _state(1.0)) and states_equal(store.get(1, round_num=2), _state(2.0))
    store.commit(7, {1: _state(7.0)})
    assert store.collect(needed_rounds=[]) == 3  # now rounds 7 and 6 only: c0-r1, c1-r2, c1-r4 go


def test_a_new_store_on_the_same_directory_finds_every_version(tmp_path: Path) -> None:
    first = ClientStateStore("memory", tmp_path / "s")
    first.commit(1, {5: _state(1.0), 1234: _state(2.0)})
    first.commit(2, {5: _state(3.0)})
    (tmp_path / "s" / "00000" / "c5-r9.state.tmp").write_bytes(b"half a write")
    again = ClientStateStore("disk", tmp_path / "s")
    assert again.clients() == [5, 1234] and again.num_entries() == 3
    assert not list((tmp_path / "s").rglob("*.tmp")), "an interrupted write's leftover goes"
    again.rewind(1)
    assert states_equal(again.get(5), _state(1.0)) and states_equal(again.get(1234), _state(2.0))
    assert not list((tmp_path / "s").rglob("c5-r2.state")), "a rewind deletes the abandoned version's file"


def test_import_takes_each_clients_newest_version_up_to_the_round(tmp_path: Path) -> None:
    source = ClientStateStore("disk", tmp_path / "a")
    source.commit(1, {0: _state(1.0), 1: _state(1.0)})
    source.commit(2, {0: _state(2.0)})
    source.commit(3, {1: _state(3.0)})
    target = ClientStateStore("memory", tmp_path / "b")
    target.import_from(tmp_path / "a", 2)
    assert target.round == 2 and target.num_entries() == 2
    assert states_equal(target.get(0), _state(2.0)) and states_equal(target.get(1), _state(1.0))


def test_a_corrupt_entry_is_named(tmp_path: Path) -> None:
    store = ClientStateStore("disk", tmp_path / "s")
    store.commit(1, {3: _state(1.0)})
    path = next((tmp_path / "s").rglob("c3-r1.state"))
    raw = bytearray(path.read_bytes())
    raw[-2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"c3-r1\.state is corrupt"):
        store.get(3)


def test_clear_forgets_an_earlier_runs_states(tmp_path: Path) -> None:
    store = ClientStateStore("memory", tmp_path / "s")
    store.commit(1, {3: _state(1.0)})
    store.clear()
    assert store.get(3) == {} and not list((tmp_path / "s").rglob("*.state"))
    assert ClientStateStore("disk", tmp_path / "s").clients() == []


def test_an_unknown_kind_names_the_setting() -> None:
    with pytest.raises(ValueError, match="state_store must be 'memory' or 'disk'"):
        ClientStateStore("redis")


def test_state_values_are_checked_and_copied_deeply() -> None:
    assert state_problem({"w": torch.ones(2), "xs": [1, 2.0, None, ("a", True)], "d": {"k": torch.zeros(1)}}) is None
    assert state_problem([1]) == "state must be a dict, not list"
    assert state_problem({"d": {1: 2}}) == "state['d'] has the key 1: keys must be strings"
    assert "state['xs'][1] is a set" in str(state_problem({"xs": [1, {2}]}))
    nested = {"w": torch.ones(2, requires_grad=True), "xs": [torch.zeros(1)]}
    copied = copy_state(nested)
    assert not copied["w"].requires_grad and copied["xs"][0] is not nested["xs"][0]
    assert states_equal(copied, {"w": torch.ones(2), "xs": [torch.zeros(1)]})
    assert not states_equal({"w": torch.ones(2)}, {"w": torch.ones(2, dtype=torch.float64)})
    assert not states_equal({"n": 1}, {"n": 1.0})
