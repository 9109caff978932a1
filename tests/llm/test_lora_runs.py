"""LoRA and full fine-tuning of a tiny causal LM from the command line: only the trainable parameters are federated,
serial equals process bitwise, the checkpoint holds no base, and what cannot run is refused in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli, warnings_on_stderr

from fedsim.core.checkpoint import load_checkpoint
from fedsim.core.params import ParamLayout, flatten, frozen_hash, load_flat
from fedsim.models.hf_lm import LoRA, hf_causal_lm

SEQ_LEN, HIDDEN = 24, 32


def tiny(adapter: bool, vocab: int = 40) -> torch.nn.Module:
    """The model the runs below build (c_attn adapters of rank 8)."""
    model = hf_causal_lm(input_shape=(SEQ_LEN,), num_classes=vocab, hidden_size=HIDDEN, seed=0)
    return LoRA(r=8, alpha=16, target_modules=["c_attn"]).apply(model) if adapter else model


def args(files: dict[str, Path], run_dir: Path, *extra: str) -> list[str]:
    """A 2-round run of 2 of the 4 users' clients on the instruction file."""
    return [
        "model=hf_causal_lm",
        f"model.hidden_size={HIDDEN}",
        "data=jsonl_instructions",
        f"data.path={files['data']}",
        f"data.tokenizer={files['tokenizer']}",
        f"data.seq_len={SEQ_LEN}",
        "data.user_column=user",
        "partition=natural",
        "num_rounds=2",
        "clients_per_round=2",
        "client.optimizer.lr=0.5",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def final_params(run_dir: Path) -> torch.Tensor:
    """The global weights in the run's last checkpoint."""
    return load_checkpoint(sorted((run_dir / "checkpoints").glob("*.ckpt"))[-1])["params"]


def test_federated_vector_is_exactly_the_trainable_parameters() -> None:
    model = tiny(adapter=True)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert ParamLayout.of(model).names == tuple(n for n, _ in trainable)
    assert all(".lora_A." in n or ".lora_B." in n for n, _ in trainable)
    flat = flatten(model)  # 2 layers x r x (A: in + B: out, out = 3 hidden for c_attn)
    assert flat.numel() == sum(p.numel() for _, p in trainable) == 2 * 8 * (HIDDEN + 3 * HIDDEN)
    base = frozen_hash(model)
    load_flat(model, torch.arange(flat.numel(), dtype=torch.float32))
    assert torch.equal(flatten(model), torch.arange(flat.numel(), dtype=torch.float32))
    assert frozen_hash(model) == base  # writing the vector touches no frozen weight


def test_full_fine_tuning_federates_every_weight_once() -> None:
    model = tiny(adapter=False)
    # GPT-2 ties lm_head.weight to the embedding: one entry, not two
    assert ParamLayout.of(model).numel == sum(p.numel() for p in model.parameters())
    assert frozen_hash(model) == frozen_hash(tiny(adapter=False))  # seeded: every worker builds the same


@pytest.mark.slow
@pytest.mark.parametrize("adapter", ["lora", "none"])
def test_run_federates_only_the_trainable_weights(adapter: str, llm_files: dict[str, Path], tmp_path: Path) -> None:
    extra = ["adapter=lora", "adapter.target_modules=[c_attn]"] if adapter == "lora" else ["adapter=none"]
    results = {}
    for executor in ("serial", "process") if adapter == "none" else ("serial",):  # LoRA: test_lora_executors.py
        run = run_cli(args(llm_files, tmp_path / executor, f"executor={executor}", *extra))
        assert run.returncode == 0, run.stderr
        results[executor] = final_params(tmp_path / executor)
    assert adapter == "lora" or torch.equal(results["serial"], results["process"])
    from tokenizers import Tokenizer

    model = tiny(adapter == "lora", vocab=Tokenizer.from_file(str(llm_files["tokenizer"])).get_vocab_size())
    layout = ParamLayout.of(model)
    assert results["serial"].numel() == layout.numel
    rounds = [json.loads(line) for line in (tmp_path / "serial" / "metrics.jsonl").read_text().splitlines()]
    assert rounds[0]["comm/bytes_up"] == 2 * 4 * layout.numel  # two clients' float32 vectors, nothing else
    # the last round is evaluated: perplexity is exp of the mean token loss, the same float64
    assert rounds[-1]["eval/perplexity"] == math.exp(rounds[-1]["eval/loss"])
    if adapter == "lora":  # B starts at zero (LoRA's initialisation): it trained
        b_rows = layout.mask(layout.matching(r"lora_B"))
        assert bool(results["serial"][b_rows].abs().gt(0).any())


@pytest.mark.slow
def test_lora_checkpoint_holds_adapters_not_the_base(llm_files: dict[str, Path], tmp_path: Path) -> None:
    run = run_cli(args(llm_files, tmp_path, "adapter=lora", "adapter.target_modules=[c_attn]"))
    assert run.returncode == 0, run.stderr
    model = tiny(adapter=True)
    adapter_bytes = 4 * flatten(model).numel()
    base_bytes = 4 * sum(p.numel() for p in model.parameters() if not p.requires_grad)
    checkpoint = sorted((tmp_path / "checkpoints").glob("*.ckpt"))[-1]
    assert final_params(tmp_path).numel() * 4 == adapter_bytes
    # the rest of a checkpoint (history, settings, strategy) is a few KB on a 2-round run; the base is 10x that
    assert adapter_bytes < checkpoint.stat().st_size < adapter_bytes + 12_000 < base_bytes


@pytest.mark.slow
def test_missing_model_path_is_one_line(llm_files: dict[str, Path], tmp_path: Path) -> None:
    run = run_cli(args(llm_files, tmp_path / "run", f"model.path={tmp_path / 'no-model'}"))
    assert run.returncode == 2
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and f"model.path={tmp_path / 'no-model'} is not a directory" in lines[0]
    assert "huggingface-cli download gpt2 --local-dir DIR" in lines[0]


@pytest.mark.slow
def test_vmap_refuses_dropout_in_one_line(llm_files: dict[str, Path], tmp_path: Path) -> None:
    """executor=vmap trains LoRA (tests/llm/test_lora_vmap.py) but has no per-client random numbers."""
    with warnings_on_stderr():
        run = run_cli(args(llm_files, tmp_path / "run", "executor=vmap", "adapter=lora", "adapter.dropout=0.1"))
    assert run.returncode == 2
    lines = run.stderr.splitlines()  # exactly one: the PEFT and transformers warnings are in run.log
    assert len(lines) == 1 and "executor=vmap cannot vectorise dropout" in lines[0], run.stderr
    assert "set adapter.dropout=0 and model.dropout=0" in lines[0]
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before any training
