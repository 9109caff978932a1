"""What a run prints about its result (issue #43): a classification run's round lines and final line are the same
bytes as before language models came (a token task's are in tests/llm/test_perplexity_lines.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import run_cli


@pytest.mark.slow
def test_a_classification_runs_lines_name_the_accuracy_as_they_always_did(tmp_path: Path) -> None:
    args = ["num_rounds=2", "clients_per_round=3", "evaluate_clients=all", "logger.progress=false"]
    run = run_cli([*args, f"hydra.run.dir={tmp_path}"])
    assert run.returncode == 0, run.stderr
    rounds = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert not any("perplexity" in key for r in rounds for key in r) and "final_perplexity" not in summary
    log = [line.split(" - ", 1)[1] for line in (tmp_path / "run.log").read_text().splitlines() if "][fedsim][" in line]
    for r in rounds:
        n, g = int(r["eval_global/clients"]), "eval_global/accuracy"
        assert (
            f"round {r['round']}: test accuracy {r['eval/accuracy']:.4f}, test loss {r['eval/loss']:.4f}, "
            f"train loss {r['train/loss']:.4f}"
        ) in log
        assert (
            f"round {r['round']}: {n} clients' accuracy, global {r[g]:.4f} (p10 {r[g + '_p10']:.4f}, "
            f"worst 10% {r[g + '_worst10']:.4f}, std {r[g + '_std']:.4f})"
        ) in log
    assert run.stdout.splitlines()[-1] == (
        f"final test accuracy: {summary['final_accuracy']:.4f} (best {summary['best_accuracy']:.4f}, 2 rounds, "
        f"{summary['wall_time_s']:.1f} s) -> {tmp_path}"
    )
