"""A run from a local pretrained directory (`model.path`, what `save_pretrained` or `huggingface-cli download` writes)
loads that model's weights: its frozen base is the saved one, bit for bit, and only the adapters travel."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cli_runner import run_cli
from test_lora_runs import HIDDEN, SEQ_LEN, args, final_params
from tokenizers import Tokenizer

from fedsim.core.params import flatten, frozen_hash
from fedsim.models.hf_lm import LoRA, hf_causal_lm


def saved_model(files: dict[str, Path], folder: Path) -> torch.nn.Module:
    """A tiny GPT-2 of the tokenizer's vocabulary, seeded differently from any run's, saved into ``folder``."""
    vocab = Tokenizer.from_file(str(files["tokenizer"])).get_vocab_size()
    model = hf_causal_lm(input_shape=(SEQ_LEN,), num_classes=vocab, hidden_size=HIDDEN, seed=1234)
    model.lm.save_pretrained(folder)
    return model


def test_model_path_loads_the_saved_weights(llm_files: dict[str, Path], tmp_path: Path) -> None:
    saved = saved_model(llm_files, tmp_path / "gpt2-tiny")
    loaded = hf_causal_lm(input_shape=(SEQ_LEN,), num_classes=1, path=str(tmp_path / "gpt2-tiny"))
    assert saved.state_dict().keys() == loaded.state_dict().keys()
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in saved.state_dict().items())
    lora = LoRA(r=4, target_modules=["c_attn"], seed=0)
    assert frozen_hash(lora.apply(loaded)) == frozen_hash(lora.apply(saved))  # the base every worker checks


@pytest.mark.slow
def test_a_run_from_model_path_trains_adapters_on_the_saved_base(llm_files: dict[str, Path], tmp_path: Path) -> None:
    saved = saved_model(llm_files, tmp_path / "gpt2-tiny")
    extra = [f"model.path={tmp_path / 'gpt2-tiny'}", "adapter=lora", "adapter.r=4", "adapter.target_modules=[c_attn]"]
    run = run_cli(args(llm_files, tmp_path / "run", "num_rounds=1", *extra))
    assert run.returncode == 0, run.stderr
    adapters = flatten(LoRA(r=4, target_modules=["c_attn"], seed=0).apply(saved))
    assert final_params(tmp_path / "run").numel() == adapters.numel()  # the adapters travel, not the saved base
