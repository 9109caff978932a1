"""A run directory written by fedsim before its modules moved into packages (commit d996d10: SCAFFOLD with its client
states on the disk store, top-k compression with error feedback, the sampled clock, a checkpoint after each of 2
rounds) resumes with today's code, and the resumed run ends bitwise equal to an uninterrupted run of today's code:
the same weights, strategy state, byte ledger, clock, client states and metrics. The fixture is kept as written
(``tests/fixtures/run_d996d10``, less its TensorBoard files and log), so a change of the checkpoint format fails here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_runner import run_cli

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


@pytest.mark.slow
def test_a_run_written_before_the_packages_moved_resumes_bitwise(tmp_path: Path) -> None:
    resumed, fresh = tmp_path / "resumed", tmp_path / "fresh"
    shutil.copytree(FIXTURE, resumed)
    done = run_cli([*SETTINGS, "num_rounds=4", "resume=true", f"hydra.run.dir={resumed}"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "continuing at round 3" in done.stdout + done.stderr
    done = run_cli([*SETTINGS, "num_rounds=4", f"hydra.run.dir={fresh}"])
    assert done.returncode == 0, done.stderr[-3000:]
    _, after_resume = resolve(resumed / "checkpoints" / "round-000004.ckpt")
    _, uninterrupted = resolve(fresh / "checkpoints" / "round-000004.ckpt")
    assert sorted(after_resume) == sorted(uninterrupted)
    for key in ("params", "strategy", "comm", "clock", "client_state_round", "fingerprint", "settings"):
        assert _equal(after_resume[key], uninterrupted[key]), key
    states = sorted((resumed / "checkpoints" / "client_state").rglob("*.state"))
    assert states and [p.read_bytes() for p in states] == [
        (fresh / p.relative_to(resumed)).read_bytes() for p in states
    ]
    assert _rounds(resumed) == _rounds(fresh)
