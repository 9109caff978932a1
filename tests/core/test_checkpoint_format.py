"""A run directory written by fedsim before its modules moved into packages (commit d996d10: SCAFFOLD with its client
states on the disk store, top-k compression with error feedback, the sampled clock, a checkpoint after each of 2
rounds) resumes with today's code exactly as a checkpoint in today's format holding the same state does: the same
weights, strategy state, byte ledger, clock, client states and metrics at the end. The fixture is kept as written
(``tests/fixtures/run_d996d10``, less its TensorBoard files and log), so a change of the checkpoint format fails here.

The state in today's format is the fixture read by today's code and written again (``Server.save_checkpoint``), so
the comparison holds on any CPU: the fixture was written on an AMD machine, and an uninterrupted run on an Intel one
differs from it in the last bits of round 1 already (different kernels), which says nothing about the format.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_runner import run_cli

from fedsim.cli.run import build_server, compose
from fedsim.core.checkpoint import resolve

FIXTURE = Path(__file__).parents[1] / "fixtures" / "run_d996d10"
SETTINGS = [
    "strategy=scaffold",
    "state_store=disk",
    "compression=topk",
    "compression.error_feedback=true",
    "clock=sampled",
    "checkpoint_every=1",
    "logger.progress=false",
    "logger.tensorboard=false",
]


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _rounds(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's round records without the wall-clock and memory measurements."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "system/"))} for r in records if "client_id" not in r
    ]


def _rewritten(fixture: Path, run_dir: Path) -> None:
    """The fixture's round-2 state read by today's code and written to ``run_dir`` in today's format (its client
    states copied into ``run_dir``'s store, its metrics history into ``run_dir/metrics.jsonl``)."""
    server = build_server(compose([*SETTINGS, "num_rounds=4", f"resume={fixture}"]), run_dir)
    assert server.start_round == 3
    server.save_checkpoint(2)
    server.logger.close()


@pytest.mark.slow
def test_a_run_written_before_the_packages_moved_resumes_bitwise(tmp_path: Path) -> None:
    resumed, fresh = tmp_path / "resumed", tmp_path / "fresh"
    shutil.copytree(FIXTURE, resumed)
    _rewritten(FIXTURE, fresh)
    _, written = resolve(FIXTURE / "checkpoints" / "round-000002.ckpt")
    _, read_back = resolve(fresh / "checkpoints" / "round-000002.ckpt")
    for key in set(written) - {"settings"}:  # every entry read as written (today's settings have more keys)
        assert _equal(read_back[key], written[key]), key
    done = run_cli([*SETTINGS, "num_rounds=4", "resume=true", f"hydra.run.dir={resumed}"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "continuing at round 3" in done.stdout + done.stderr
    done = run_cli([*SETTINGS, "num_rounds=4", "resume=true", f"hydra.run.dir={fresh}"])
    assert done.returncode == 0, done.stderr[-3000:]
    _, after_resume = resolve(resumed / "checkpoints" / "round-000004.ckpt")
    _, uninterrupted = resolve(fresh / "checkpoints" / "round-000004.ckpt")
    assert sorted(after_resume) == sorted(uninterrupted)
    for key in ("params", "strategy", "comm", "clock", "client_state_round", "fingerprint", "settings"):
        assert _equal(after_resume[key], uninterrupted[key]), key
    manifest = after_resume["client_state_manifest"]
    assert len(manifest) and torch.equal(manifest, uninterrupted["client_state_manifest"])
    for client, version in manifest.tolist():  # every client's state as of round 4, byte for byte
        mine, theirs = (
            next((d / "checkpoints" / "client_state").rglob(f"c{client}-r{version}.state")) for d in (resumed, fresh)
        )
        assert mine.read_bytes() == theirs.read_bytes(), (client, version)
    assert _rounds(resumed) == _rounds(fresh)
