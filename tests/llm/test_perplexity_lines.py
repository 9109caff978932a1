"""A token task prints perplexity (issue #43): the round line, the clients' line and the final line lead with the
test perplexity (the token accuracy after it), and summary.json holds ``final_perplexity`` and ``best_perplexity``;
a classification run's lines are unchanged (tests/cli/test_result_lines.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import run_cli

TINY = [
    "data=synthetic_text",
    "data.num_clients=4",
    "data.tokens_per_client=100",
    "model=hf_causal_lm",
    "model.hidden_size=16",
    "model.num_layers=1",
    "partition=natural",
    "num_rounds=3",
    "clients_per_round=2",
    "evaluate_clients=all",
    "client.optimizer.lr=0.5",
    "logger.progress=false",
]


@pytest.mark.slow
def test_a_token_task_prints_its_perplexity_each_round_and_at_the_end(tmp_path: Path) -> None:
    run = run_cli([*TINY, f"hydra.run.dir={tmp_path}"])
    assert run.returncode == 0, run.stderr
    rounds = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((tmp_path / "summary.json").read_text())
    perplexities = [r["eval/perplexity"] for r in rounds]
    assert summary["final_perplexity"] == perplexities[-1] and summary["best_perplexity"] == min(perplexities)
    assert summary["final_accuracy"] == rounds[-1]["eval/accuracy"]  # the token accuracy, still there
    log = [line.split(" - ", 1)[1] for line in (tmp_path / "run.log").read_text().splitlines() if "][fedsim][" in line]
    for r in rounds:
        g = "eval_global/perplexity"
        assert (
            f"round {r['round']}: test perplexity {r['eval/perplexity']:.4f}, token accuracy {r['eval/accuracy']:.4f}, "
            f"test loss {r['eval/loss']:.4f}, train loss {r['train/loss']:.4f}"
        ) in log
        assert (  # the clients' spread of perplexity: its bad tail is the top (p90, the highest 10 %)
            f"round {r['round']}: 4 clients' perplexity, global {r[g]:.4f} (p90 {r[g + '_p90']:.4f}, "
            f"worst 10% {r[g + '_worst10']:.4f}, std {r[g + '_std']:.4f})"
        ) in log
    assert not any("test accuracy" in line for line in log)
    assert run.stdout.splitlines()[-1] == (
        f"final test perplexity: {summary['final_perplexity']:.4f} (token accuracy {summary['final_accuracy']:.4f}, "
        f"best perplexity {summary['best_perplexity']:.4f}, 3 rounds, {summary['wall_time_s']:.1f} s) -> {tmp_path}"
    )
