"""A run refused after the logger has opened its files (a combination the server refuses, a refused resume)
leaves its directory as it found it: nothing new, and nothing of an earlier run touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedsim.cli.run import build_server, compose, run_config
from fedsim.cli.run_dir_guard import removing_new_files
from fedsim.core.checkpoint import CheckpointError

BASE = ["num_rounds=2", "clients_per_round=4", "logger.progress=false", "+data.max_size=60"]


def contents(run_dir: Path) -> dict[str, bytes | None]:
    """Every path under ``run_dir`` and its bytes (``None`` for a directory)."""
    return {str(p.relative_to(run_dir)): None if p.is_dir() else p.read_bytes() for p in sorted(run_dir.rglob("*"))}


@pytest.mark.parametrize(
    "overrides",
    [
        [
            "dp=central",
            "clock=sampled",
        ],  # refused by the server, after the logger, the checkpoint probe and TensorBoard
        ["attack=sign_flip", "strategy=fedbuff"],
    ],
)
def test_a_refused_combination_leaves_an_empty_run_dir(tmp_path: Path, overrides: list[str]) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(ValueError):
        build_server(compose([*BASE, *overrides]), run_dir)
    assert contents(run_dir) == {}


def test_a_refused_resume_in_place_leaves_the_earlier_run_byte_for_byte(tmp_path: Path) -> None:
    """The resumed run's directory already holds metrics.jsonl, TensorBoard events and checkpoints; the refused
    resume opened them and added an event file of its own, which goes; the old files stay exactly as they were."""
    run_dir = tmp_path / "run"
    run_config(compose(BASE), run_dir=run_dir)
    before = contents(run_dir)
    assert any(name.startswith("tensorboard/events.") for name in before) and "metrics.jsonl" in before
    with pytest.raises(CheckpointError, match=r"client.optimizer.lr \(0.01 -> 0.03\)"):
        build_server(compose([*BASE, "num_rounds=3", "resume=true", "client.optimizer.lr=0.03"]), run_dir)
    assert contents(run_dir) == before


def test_the_guard_closes_first_and_removes_only_what_is_new_under_fedsims_names(tmp_path: Path) -> None:
    """An old checkpoint (and so its directory) stays; a new event file in a new nested directory goes, and so does
    the directory; a file another program wrote meanwhile, under a name that is not fedsim's, stays."""
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "round-000001.ckpt").write_text("earlier run")
    closed = []
    with pytest.raises(RuntimeError, match="refused"), removing_new_files(tmp_path) as on_failure:
        on_failure.append(lambda: closed.append(True))
        (tmp_path / "checkpoints" / ".write-test").write_text("x")
        (tmp_path / "tensorboard" / "deeper").mkdir(parents=True)
        (tmp_path / "tensorboard" / "deeper" / "events.out").write_bytes(b"\0")
        (tmp_path / "metrics.jsonl").write_text("")
        (tmp_path / "notes.txt").write_text("someone else's")
        raise RuntimeError("refused")
    assert closed == [True]
    assert contents(tmp_path) == {
        "checkpoints": None,
        "checkpoints/round-000001.ckpt": b"earlier run",
        "notes.txt": b"someone else's",
    }


def test_a_new_run_dir_that_the_refused_build_created_goes_too(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(ValueError):
        build_server(compose([*BASE, "dp=central", "clock=sampled"]), run_dir)
    assert not run_dir.exists()


def test_a_build_that_succeeds_keeps_everything(tmp_path: Path) -> None:
    with removing_new_files(tmp_path) as on_failure:
        on_failure.append(lambda: pytest.fail("closed although nothing failed"))
        (tmp_path / "made.txt").write_text("kept")
    assert contents(tmp_path) == {"made.txt": b"kept"}
