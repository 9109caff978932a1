"""TensorBoard shows accuracy and loss against communication (``vs_kb_sent/``), kept exactly across a resume; read
back with TensorBoard's own reader."""

from __future__ import annotations

import json
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedsim.cli.run import compose, run_config

RUN = ["num_rounds=4", "clients_per_round=5", "logger.progress=false", "compression=qsgd", "eval_every=2"]


def _points(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0}).Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def _expected(run_dir: Path, name: str) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(round(r["comm/mb_total"] * 1000), r[name]) for r in records if name in r]


def test_scalars_against_kilobytes_sent_survive_a_resume(tmp_path: Path) -> None:
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    run_config(compose(RUN), run_dir=whole)
    run_config(compose([*RUN, "num_rounds=2", "checkpoint_every=1"]), run_dir=cut)
    run_config(compose([*RUN, "resume=true"]), run_dir=cut)
    for run_dir in (whole, cut):
        loss = _points(run_dir, "vs_kb_sent/train/loss")
        assert [s for s, _ in loss] == [s for s, _ in _expected(run_dir, "train/loss")] and len(loss) == 4
        assert [s for s, _ in _points(run_dir, "vs_kb_sent/eval/accuracy")] == [
            s for s, _ in _expected(run_dir, "eval/accuracy")
        ]
    assert _points(whole, "vs_kb_sent/train/loss") == _points(cut, "vs_kb_sent/train/loss")
    steps = [s for s, _ in _points(whole, "vs_kb_sent/train/loss")]
    assert steps == sorted(steps) and steps[0] > 0
    records = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert [e[1] for e in _points(whole, "traffic/bytes_up")] == [r["comm/bytes_up"] for r in records]
