"""Kill -9 a run whose clients keep state (Ditto-style personal models, under SCAFFOLD), then resume from the
newest and from an older kept checkpoint: both continue exactly as the uninterrupted run did."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli

from fedsim.client.state import ClientStateStore
from fedsim.core.checkpoint import list_checkpoints, load_latest
from fedsim.core.state_values import states_equal

ROUNDS = 8  # a kill after round 2, 3 or 4: the run is still going (4 or more rounds left) when it comes
MEASURED = ("time/", "system/")  # wall-clock and memory readings differ between any two runs
HERE = Path(__file__).parent


def _args(run_dir: Path, *overrides: str) -> list[str]:
    return [
        f"num_rounds={ROUNDS}",
        "checkpoint_every=1",
        "keep_checkpoints=4",
        "clients_per_round=5",
        "client._target_=stateful_clients.PersonalClient",
        "strategy=scaffold",
        "logger.progress=false",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)}


def _metrics(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(MEASURED)} for r in records]


def _final_states(run_dir: Path) -> dict[int, dict]:
    store = ClientStateStore("disk", run_dir / "checkpoints" / "client_state")
    store.rewind(ROUNDS)
    return {cid: store.get(cid) for cid in store.clients()}


def _final_entry_bytes(run_dir: Path) -> dict[str, bytes]:
    """Each client's newest state entry file, as bytes."""
    newest: dict[str, Path] = {}
    for path in sorted((run_dir / "checkpoints" / "client_state").rglob("*.state")):
        client, version = path.stem.split("-r")
        if client not in newest or int(version) > int(newest[client].stem.split("-r")[1]):
            newest[client] = path
    return {client: path.read_bytes() for client, path in newest.items()}


def _run(run_dir: Path, *overrides: str) -> None:
    """A run nothing stops, in this process (tests/cli_runner.py)."""
    done = run_cli(_args(run_dir, *overrides), pythonpath=[HERE])
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("full")
    _run(run_dir, "state_store=disk")
    return run_dir


def _kill_at_random_round(run_dir: Path, seed: int) -> int:
    kill_after = random.Random(seed).randint(2, 4)
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedsim", *_args(run_dir)],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        path = run_dir / "metrics.jsonl"
        while not (path.exists() and len(path.read_text().splitlines()) >= kill_after):
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "timed out waiting for rounds"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    return kill_after


def _assert_same_run(resumed: Path, full: Path) -> None:
    assert _metrics(resumed) == _metrics(full)
    assert torch.equal(
        load_latest(resumed / "checkpoints")[1]["params"], load_latest(full / "checkpoints")[1]["params"]
    )
    ours, theirs = _final_states(resumed), _final_states(full)
    assert ours.keys() == theirs.keys() and len(ours) >= 5
    assert all(states_equal(ours[c], theirs[c]) for c in ours)
    assert _final_entry_bytes(resumed) == _final_entry_bytes(full)  # the personal states, byte for byte


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run killed with SIGKILL after a random round; each test works on a copy of it."""
    run_dir = tmp_path_factory.mktemp("killed") / "run"
    _kill_at_random_round(run_dir, seed=int(time.time()))
    return run_dir


@pytest.mark.slow
def test_resume_from_the_newest_and_from_an_older_checkpoint(tmp_path: Path, killed: Path, uninterrupted: Path) -> None:
    newest = tmp_path / "killed"
    shutil.copytree(killed, newest)
    kept = list_checkpoints(newest / "checkpoints")
    assert len(kept) >= 2 and load_latest(newest / "checkpoints")[1]["round"] < ROUNDS
    older = tmp_path / "older"
    shutil.copytree(killed, older)

    oldest = list_checkpoints(older / "checkpoints")[0]
    _run(newest, "resume=true")  # the newest good checkpoint
    _run(older, f"resume={oldest}")  # rounds after it ran once: their states must not leak in
    _assert_same_run(newest, uninterrupted)
    _assert_same_run(older, uninterrupted)
    names = [p.name for p in list_checkpoints(older / "checkpoints")]
    assert names == [p.name for p in list_checkpoints(uninterrupted / "checkpoints")]  # no stale later checkpoint kept


@pytest.mark.slow
def test_resume_from_another_run_directory_copies_the_states_it_needs(
    tmp_path: Path, killed: Path, uninterrupted: Path
) -> None:
    source = tmp_path / "source"
    shutil.copytree(killed, source)
    checkpoint = list_checkpoints(source / "checkpoints")[-1]
    _run(tmp_path / "continued", f"resume={checkpoint}")
    full_records = _metrics(uninterrupted)
    resumed_round = int(checkpoint.stem.split("-")[1])
    assert _metrics(tmp_path / "continued")[resumed_round:] == full_records[resumed_round:]
    assert torch.equal(
        load_latest(tmp_path / "continued" / "checkpoints")[1]["params"],
        load_latest(uninterrupted / "checkpoints")[1]["params"],
    )
