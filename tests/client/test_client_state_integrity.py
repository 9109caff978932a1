"""A resume whose client states are not all there, or not intact, is refused before any work with one line naming
the bad entry and the newest earlier checkpoint that can be resumed instead (issue #34: before, a deleted newest
state file let SCAFFOLD resume, exit 0 and silently differ from the uninterrupted run; a truncated one stopped
the run with a 30-line traceback). The suggested checkpoint then resumes and ends bitwise equal to a run nothing
interrupted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli

from fedsim.client.state import ClientStateStore
from fedsim.core.checkpoint import list_checkpoints, load_checkpoint

ROUNDS = 4
SETTINGS = [
    f"num_rounds={ROUNDS}",
    "checkpoint_every=1",
    "keep_checkpoints=3",
    "clients_per_round=10",
    "strategy=scaffold",
    "logger.progress=false",
    "logger.tensorboard=false",
]


def _run(run_dir: Path, *overrides: str):  # noqa: ANN202 - a CompletedProcess
    return run_cli([*SETTINGS, f"hydra.run.dir={run_dir}", *overrides])


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A finished run per state store, with a checkpoint after each of its last 3 rounds."""
    runs = {}
    for store in ("disk", "memory"):
        run_dir = tmp_path_factory.mktemp(store)
        done = _run(run_dir, f"state_store={store}")
        assert done.returncode == 0, done.stderr[-3000:]
        runs[store] = run_dir
    return runs


def _newest_needed_entry(run_dir: Path) -> Path:
    """A client-state file the newest checkpoint needs that no earlier kept checkpoint needs (written in its round)."""
    newest = list_checkpoints(run_dir / "checkpoints")[-1]
    manifest = load_checkpoint(newest)["client_state_manifest"]
    store = ClientStateStore("disk", run_dir / "checkpoints" / "client_state")
    client, version = next((c, v) for c, v in manifest.tolist() if v == ROUNDS)
    return store._path(client, version)


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_every_checkpoint_lists_the_state_versions_its_round_reads(finished: dict[str, Path]) -> None:
    for run_dir in finished.values():
        store = ClientStateStore("disk", run_dir / "checkpoints" / "client_state")
        for path in list_checkpoints(run_dir / "checkpoints"):
            state = load_checkpoint(path)
            manifest = state["client_state_manifest"]
            assert manifest.dtype == torch.int64 and manifest.shape[1] == 2 and len(manifest) > 0
            assert torch.equal(manifest, store.manifest(state["client_state_round"]))
            assert store.problem(manifest, state["client_state_round"]) is None


@pytest.mark.parametrize("store", ["disk", "memory"])
def test_a_deleted_state_stops_the_resume_and_names_an_earlier_checkpoint(
    finished: dict[str, Path], store: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(finished[store], run_dir)
    missing = _newest_needed_entry(run_dir)
    missing.unlink()
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    done = _run(run_dir, f"state_store={store}", f"num_rounds={ROUNDS + 2}", "resume=true")
    assert done.returncode == 2
    line = _one_line(done.stderr)
    earlier = list_checkpoints(run_dir / "checkpoints")[-2]
    assert str(missing) in line and "is missing" in line and f"resume from {earlier} instead" in line, line
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before  # nothing written or removed


def test_a_truncated_state_stops_the_resume_in_one_line(finished: dict[str, Path], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(finished["memory"], run_dir)
    damaged = _newest_needed_entry(run_dir)
    damaged.write_bytes(damaged.read_bytes()[:20])
    done = _run(run_dir, "state_store=memory", f"num_rounds={ROUNDS + 2}", "resume=true")
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert str(damaged) in line and "truncated" in line and "resume from" in line, line


@pytest.mark.slow
def test_the_suggested_checkpoint_resumes_bitwise(finished: dict[str, Path], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(finished["disk"], run_dir)
    _newest_needed_entry(run_dir).unlink()
    earlier = list_checkpoints(run_dir / "checkpoints")[-2]
    done = _run(run_dir, "state_store=disk", f"resume={earlier}")
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = load_checkpoint(list_checkpoints(run_dir / "checkpoints")[-1])
    uninterrupted = load_checkpoint(list_checkpoints(finished["disk"] / "checkpoints")[-1])
    assert resumed["round"] == uninterrupted["round"] == ROUNDS
    assert torch.equal(resumed["params"], uninterrupted["params"])
    assert torch.equal(resumed["strategy"]["control"], uninterrupted["strategy"]["control"])
    assert torch.equal(resumed["client_state_manifest"], uninterrupted["client_state_manifest"])
