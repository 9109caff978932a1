"""A FedSA-LoRA run killed with SIGKILL and resumed with ``resume=true`` ends bitwise equal to one that was not: the
adapters, the metrics and every client's own B. The kill is deterministic: the run's process kills itself right
after round 2's client states are committed, before round 2's checkpoint is written, so the resume starts from round
1's checkpoint while newer client states (round 2's, never checkpointed) lie beside it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli
from own_processes import live_tagged, new_tag, tagged_environment
from test_fedsa_upload import fedsa_args

from fedsim.client.state import ClientStateStore
from fedsim.core.checkpoint import list_checkpoints, load_latest
from fedsim.strategy.fedper import STATE_KEY

ROUNDS, KILLED_IN = 3, 2

KILL_AFTER_COMMIT = """
import os, signal, sys
from fedsim.client.state import ClientStateStore
commit, kill_in = ClientStateStore.commit, int(sys.argv[1])
def commit_then_die(self, round_num, states):
    commit(self, round_num, states)
    if round_num == kill_in:
        os.kill(os.getpid(), signal.SIGKILL)
ClientStateStore.commit = commit_then_die
sys.argv = ["fedsim", *sys.argv[2:]]
from fedsim.__main__ import main
main()
"""


def overrides(files: dict[str, Path], run_dir: Path, store: str, *extra: str) -> list[str]:
    """3 rounds of 2 of the 4 users (clients come back with their B), a checkpoint after every round."""
    return [
        *fedsa_args(files, f"num_rounds={ROUNDS}", "client.epochs=2", f"state_store={store}"),
        "checkpoint_every=1",
        "logger.progress=false",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def metrics(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "system/"))} for r in records]


def final_states(run_dir: Path) -> dict[int, dict[str, torch.Tensor]]:
    """Every client's kept B as of the last round, read back from the run's client-state files."""
    store = ClientStateStore("disk", run_dir / "checkpoints" / "client_state")
    store.rewind(ROUNDS)
    return {cid: store.get(cid)[STATE_KEY] for cid in store.clients()}


@pytest.mark.slow
@pytest.mark.parametrize("store", ["memory", "disk"])
def test_killed_fedsa_lora_run_resumes_bitwise(store: str, llm_files: dict[str, Path], tmp_path: Path) -> None:
    full, killed = tmp_path / "full", tmp_path / "killed"
    done = run_cli(overrides(llm_files, full, store))
    assert done.returncode == 0, done.stderr
    tag = new_tag()
    proc = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_COMMIT, str(KILLED_IN), *overrides(llm_files, killed, store)],
        env=tagged_environment(tag),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL
    assert not live_tagged(tag)  # no worker outlived the killed run
    assert [p.name for p in list_checkpoints(killed / "checkpoints")] == ["round-000001.ckpt"]
    assert len(metrics(killed)) == KILLED_IN - 1
    resumed = run_cli(overrides(llm_files, killed, store, "resume=true"))
    assert resumed.returncode == 0, resumed.stderr
    assert torch.equal(load_latest(killed / "checkpoints")[1]["params"], load_latest(full / "checkpoints")[1]["params"])
    assert metrics(killed) == metrics(full) and len(metrics(full)) == ROUNDS
    ours, theirs = final_states(killed), final_states(full)
    assert ours.keys() == theirs.keys() and len(ours) >= 2
    for cid, entries in theirs.items():
        assert entries.keys() == ours[cid].keys()
        assert all(torch.equal(value, ours[cid][name]) for name, value in entries.items()), cid
