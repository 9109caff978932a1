"""``experiment=lora_tiny`` from the command line, shortened: it runs with no file, logs perplexity, sends the
adapters (not the model) up, and logs the spread of every client's perplexity."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cli_runner import run_cli
from hydra.utils import instantiate

from fedsim.cli.run import compose
from fedsim.core.params import ParamLayout

SHORT = ["experiment=lora_tiny", "num_rounds=2", "data.num_clients=4", "clients_per_round=2"]


def preset_model() -> tuple[int, int]:
    """The preset's model as its run builds it: (federated parameters, all parameters)."""
    cfg = compose(SHORT)
    data = cfg.data
    model = instantiate(cfg.model)(input_shape=(data.seq_len,), num_classes=data.vocab_size)
    model = instantiate(cfg.adapter).apply(model)
    return ParamLayout.of(model).numel, sum(p.numel() for p in model.parameters())


@pytest.mark.slow
def test_lora_tiny_logs_perplexity_adapter_bytes_and_client_spread(tmp_path: Path) -> None:
    run = run_cli([*SHORT, f"hydra.run.dir={tmp_path}"])
    assert run.returncode == 0, run.stderr
    rounds = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [1, 2]
    adapters, everything = preset_model()
    for r in rounds:
        assert r["eval/perplexity"] == math.exp(r["eval/loss"])  # the same float64
        assert r["comm/bytes_up"] == 2 * 4 * adapters < 2 * 4 * everything  # two clients' float32 adapters
        assert r["eval_global/clients"] == 4  # every client, on its own held-out windows
        spread = [r[f"eval_global/perplexity_{q}"] for q in ("p10", "p50", "p90")]
        assert spread == sorted(spread) and spread[0] < spread[2] and r["eval_global/perplexity_std"] > 0
    assert adapters * 20 < everything  # the adapters are a few percent of the model
