"""Issue #33: every strategy that works on the flat vector works on LoRA adapters unchanged (the vector is the
adapters alone), including those whose client half cuts the vector into the model's parameters (SCAFFOLD, FedDyn)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))  # tests/data: the LLM file writers

import llm_files  # noqa: E402

from fedsim.cli.run import build_server, compose  # noqa: E402
from fedsim.core.params import ParamLayout  # noqa: E402

STRATEGIES = ["fedprox", "fedadam", "scaffold", "feddyn", "fednova", "median", "ditto", "fedsa_lora"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return llm_files.write_instructions(tmp_path_factory.mktemp("adapters"), 40, 8)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_rounds_on_the_adapters(strategy: str, files: list[str]) -> None:
    run = [*files, "data=jsonl_instructions", "model=hf_causal_lm", "model.hidden_size=16", "model.num_layers=1"]
    run += ["adapter=lora", f"strategy={strategy}", "partition=natural", "num_rounds=2", "clients_per_round=4"]
    server = build_server(compose([*run, "logger=quiet"]))
    start = server.params.clone()
    history = server.run().history
    layout = ParamLayout.of(server.model_factory())
    assert all(".lora_" in name for name in layout.names) and server.params.numel() == layout.numel
    assert all(math.isfinite(r["train/loss"]) for r in history if "train/loss" in r)
    assert math.isfinite(history[-1]["eval/perplexity"])
    assert not torch.equal(server.params, start)  # the shared adapters moved (FedSA-LoRA's A, the others' A and B)
