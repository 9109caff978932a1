"""Per-client perplexity on token data: the distribution's known answer, the per-client file's column, token scores
from a real evaluation task of a tiny GPT-2, and classic scores without any of it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fedsim.client.base import Client
from fedsim.client.evaluation import TokenScore, csv_text, summary
from fedsim.core.params import flatten
from fedsim.core.types import ClientScore, EvalResult, EvalTask
from fedsim.data.instructions import jsonl_instructions
from fedsim.executor.eval_task import run_eval_task
from fedsim.models.hf_lm import LoRA, hf_causal_lm

# two clients: 2 examples at loss ln 4 (perplexity 4), 6 at ln 16 (perplexity 16)
SCORES = [TokenScore(0, 2, math.log(4), 0.5, math.log(2), 0.75, True), TokenScore(1, 6, math.log(16), 0.25)]


def test_summary_adds_the_clients_perplexities() -> None:
    metrics = summary(SCORES, personal=False)
    # exp of the example-weighted loss: exp((2 ln 4 + 6 ln 16) / 8) = 4^(1/4) · 16^(3/4) = √2 · 8
    assert metrics["eval_global/perplexity"] == pytest.approx(8 * math.sqrt(2), rel=1e-15)
    assert metrics["eval_global/perplexity"] == math.exp(metrics["eval_global/loss"])
    assert metrics["eval_global/perplexity_mean"] == pytest.approx(10.0, rel=1e-15)  # (4 + 16) / 2
    assert metrics["eval_global/perplexity_worst10"] == pytest.approx(16.0, rel=1e-15)  # worst: the highest
    assert metrics["eval_global/perplexity_best10"] == pytest.approx(4.0, rel=1e-15)
    assert metrics["eval_global/perplexity_p10"] == pytest.approx(4 + 0.1 * 12, rel=1e-15)  # linear interpolation
    personal = summary([SCORES[0]], personal=True)
    assert personal["eval_personal/perplexity"] == pytest.approx(2.0, rel=1e-15)  # exp(ln 2)


def test_per_client_file_has_a_perplexity_column() -> None:
    lines = csv_text(SCORES, personal=True).splitlines()
    assert lines[0] == (
        "client,num_examples,loss,accuracy,perplexity,personal_loss,personal_accuracy,personal_perplexity,personalised"
    )
    row = lines[1].split(",")
    assert float(row[4]) == pytest.approx(4.0, rel=1e-15) and float(row[7]) == pytest.approx(2.0, rel=1e-15)
    assert lines[2].split(",")[-2] == "nan"  # client 1 has no personal model: no personal perplexity


def test_classic_scores_have_no_perplexity() -> None:
    classic = [ClientScore(s.client_id, s.num_examples, s.loss, s.accuracy) for s in SCORES]
    assert not [k for k in summary(classic, personal=True) if "perplexity" in k]
    assert csv_text(classic, personal=False).splitlines()[0] == "client,num_examples,loss,accuracy"


@pytest.mark.slow  # builds the first GPT-2 of the process: the import of transformers and peft (5-8 s)
def test_an_evaluation_task_on_token_data_gives_token_scores(llm_files: dict[str, Path]) -> None:
    split = jsonl_instructions(path=str(llm_files["data"]), tokenizer=str(llm_files["tokenizer"]), seq_len=24)
    base = hf_causal_lm(input_shape=(24,), num_classes=split.train.num_classes, hidden_size=32, seed=0)
    model = LoRA(r=4, target_modules=["c_attn"]).apply(base)
    clients = [Client(0, [0, 1], [2, 3, 4]), Client(1, [5], [6, 7])]
    result = run_eval_task(model, clients, split.train, flatten(model), EvalTask((0, 1), 1), "main")
    assert isinstance(result, EvalResult) and all(isinstance(s, TokenScore) for s in result.scores)
    metrics = summary(list(result.scores), personal=False)
    perplexities = sorted(math.exp(s.loss) for s in result.scores)
    assert metrics["eval_global/perplexity_best10"] == perplexities[0] > 1.0
    assert metrics["eval_global/perplexity_worst10"] == perplexities[1]
    assert torch.isfinite(torch.tensor(perplexities)).all()


def test_a_clients_token_accuracy_is_the_mean_of_its_examples_shares(llm_files: dict[str, Path]) -> None:
    """Not a count: each example contributes its share of correct scored tokens (a fraction, never floored)."""
    split = jsonl_instructions(path=str(llm_files["data"]), tokenizer=str(llm_files["tokenizer"]), seq_len=24)
    model = hf_causal_lm(input_shape=(24,), num_classes=split.train.num_classes, hidden_size=32, seed=0)
    clients = [Client(0, [0], [2, 3, 4]), Client(1, [1], [5, 6, 7])]
    rows = torch.arange(2, 8)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(3):  # fit the test rows a little, so that some tokens and not all are right
        optimizer.zero_grad()
        Client(0, [0]).loss(model, split.train.x[rows], split.train.y[rows]).backward()
        optimizer.step()
    result = run_eval_task(model, clients, split.train, flatten(model), EvalTask((0, 1), 1), "main")
    assert isinstance(result, EvalResult)
    model.eval()
    for score, client in zip(result.scores, clients, strict=True):
        with torch.no_grad():
            x, y = split.train.x[client.test_indices], split.train.y[client.test_indices]
            scored = y != -100
            shares = ((model(x).argmax(-1) == y) & scored).sum(1) / scored.sum(1)
        # each share is rounded to float32 once (2^-24 relative) before the float64 mean: 1e-6 covers it
        assert abs(score.accuracy - shares.double().mean().item()) <= 1e-6
    assert any(0 < s.accuracy < 1 and s.accuracy * 3 != round(s.accuracy * 3) for s in result.scores)
