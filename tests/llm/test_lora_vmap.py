"""``executor=vmap`` on a tiny GPT-2 with LoRA adapters: only the adapters are stacked per client (the frozen base,
GPT-2's tied embedding and output weight included, is used once and unbatched), the token loss is the serial
executor's (the mean over a batch's scored tokens), and the run ends where the serial executor's does, up to
float32 rounding; dropout is refused in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import WORDS, rows, train_tokenizer
from test_seq_cls import write_rows

from fedsim.cli.run import build_data, build_model_factory, compose, run_config
from fedsim.core.params import ParamLayout, flatten
from fedsim.data.tokenizer import load_tokenizer
from fedsim.executor import VmapUnsupportedError
from fedsim.executor.vmap.executor import batchable_forward, check_model
from fedsim.executor.vmap.train import ChunkModel, split_state, stack

UNIT_ROUNDOFF = 2.0**-24  # float32
SEQ_LEN, BATCH, ROUNDS = 24, 5, 2


def tolerance(sequential_steps: int, longest_sum: int) -> float:
    """The relative error of the final weights that float32 rounding alone can produce between vmap's batched
    kernels and serial's (tests/executor/vmap/test_vmap.py derives it): ``sqrt(longest_sum)`` unit roundoffs per sum
    in another order, one such perturbation per step of the longest chain of dependent steps, added linearly."""
    return sequential_steps * math.sqrt(longest_sum) * UNIT_ROUNDOFF


def overrides(files: dict[str, Path], adapter: str, *extra: str) -> list[str]:
    """2 rounds of the 4 users' clients on the instruction file (prompt and padding labels are -100, so examples
    score different numbers of tokens), SGD in batches of 5 (the last batch of an epoch is short: padded and
    masked under vmap); ``adapter``'s adapters on ``c_attn``."""
    return [
        "model=hf_causal_lm",
        "model.hidden_size=32",
        "data=jsonl_instructions",
        f"data.path={files['data']}",
        f"data.tokenizer={files['tokenizer']}",
        f"data.seq_len={SEQ_LEN}",
        "data.user_column=user",
        "partition=natural",
        f"num_rounds={ROUNDS}",
        "clients_per_round=4",
        f"client.batch_size={BATCH}",
        "client.optimizer.lr=0.5",
        f"adapter={adapter}",
        *(["adapter.target_modules=[c_attn]"] if adapter != "none" else []),
        "logger=quiet",
        *extra,
    ]


@pytest.fixture(scope="module")
def llm_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The shared instruction rows (tests/llm/conftest.py) with responses of 1 to 5 words, so that examples score
    different numbers of tokens (a mean over tokens and a mean of per-example means differ), and their tokenizer."""
    folder = tmp_path_factory.mktemp("llm_vmap")
    lines = [{**r, "output": " ".join((r["output"].split() * 2)[: 1 + i % 5])} for i, r in enumerate(rows(48))]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    texts = [f"### Instruction: Input: Response: {r['instruction']} {r['input']} {r['output']}" for r in lines]
    return {"data": folder / "train.jsonl", "tokenizer": train_tokenizer(texts, folder / "tokenizer.json")}


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("adapter", ["lora", "ffa_lora", "none"])
def test_vmap_matches_serial_on_token_labels(adapter: str, llm_files: dict[str, Path], tmp_path: Path) -> None:
    cfg = {ex: compose(overrides(llm_files, adapter, f"executor={ex}")) for ex in ("serial", "vmap")}
    serial = run_config(cfg["serial"], tmp_path / "serial")
    vmapped = run_config(cfg["vmap"], tmp_path / "vmap")
    data = build_data(cfg["serial"])
    steps = ROUNDS * math.ceil(max(len(part) for part in data.client_train) / BATCH)
    # the longest sums: a weight's gradient over a batch's positions (B x seq_len), e.g. LoRA B's or lm_head's
    bound = tolerance(steps, BATCH * SEQ_LEN)
    initial = flatten(build_model_factory(cfg["serial"], data)())
    assert vmapped.params.numel() == serial.params.numel() == initial.numel()
    assert relative_error(serial.params, initial) > 1e3 * bound, "training must move the weights"
    assert relative_error(vmapped.params, serial.params) <= bound
    # the reported loss is the mean over scored tokens too (a mean of per-example means differs by percents here)
    for s, v in zip(serial.history, vmapped.history, strict=True):
        assert v["train/loss"] == pytest.approx(s["train/loss"], rel=bound)


def test_vmap_matches_serial_on_a_lora_classifier(tmp_path: Path) -> None:
    """model=hf_seq_cls: the adapters and the new classification head are stacked (classic labels, attention mask).
    lr 0.05: at 0.5 this classifier's SGD is unstable and amplifies rounding differences step after step (serial and
    vmap ended 7e-4 apart after 2 rounds), which the bound, a sum of per-step roundings, does not cover."""
    data = write_rows(tmp_path / "train.jsonl", 40, by_name=True)
    tokenizer = train_tokenizer([" ".join(WORDS)], tmp_path / "tokenizer.json")
    seq_len, batch = 8, 4
    common = [
        "model=hf_seq_cls",
        "model.hidden_size=32",
        f"model.vocab_size={load_tokenizer(str(tokenizer)).vocab_size}",
        "adapter=lora",
        "adapter.r=4",
        "adapter.target_modules=[c_attn]",
        "data=jsonl_classification",
        f"data.path={data}",
        f"data.tokenizer={tokenizer}",
        f"data.seq_len={seq_len}",
        "partition=dirichlet",
        "partition.num_clients=3",
        "partition.min_size=2",
        f"num_rounds={ROUNDS}",
        "clients_per_round=3",
        f"client.batch_size={batch}",
        "client.optimizer.lr=0.05",
        "logger=quiet",
    ]
    cfg = {ex: compose([*common, f"executor={ex}"]) for ex in ("serial", "vmap")}
    serial = run_config(cfg["serial"], tmp_path / "serial")
    vmapped = run_config(cfg["vmap"], tmp_path / "vmap")
    split = build_data(cfg["serial"])
    steps = ROUNDS * math.ceil(max(len(part) for part in split.client_train) / batch)
    bound = tolerance(steps, batch * seq_len)  # e.g. B's gradient over the batch's positions
    initial = flatten(build_model_factory(cfg["serial"], split)())
    assert relative_error(serial.params, initial) > 1e3 * bound, "training must move the weights"
    assert relative_error(vmapped.params, serial.params) <= bound


def test_only_the_adapters_are_stacked_per_client(llm_files: dict[str, Path]) -> None:
    cfg = compose(overrides(llm_files, "lora", "executor=vmap"))
    data = build_data(cfg)
    model = build_model_factory(cfg, data)()
    layout = ParamLayout.of(model)
    clients = 20
    trained, shared = split_state(ChunkModel(model, layout, data.train, None, "test"), flatten(model))
    assert set(trained) == set(layout.names) and all(".lora_" in name for name in trained)
    assert shared == {}  # the frozen base stays the model's own tensors: no copy, unbatched in every call
    stacked = stack(trained, clients)
    assert all(v.shape[0] == clients for v in stacked.values())
    base = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    # 20 clients' parameters: 20 x the adapters (2 layers x r 8 x (32 + 96)), not 20 x the model
    assert sum(v.numel() for v in stacked.values()) == clients * layout.numel == clients * 2 * 8 * (32 + 96)
    assert layout.numel * 10 < base


def test_tied_output_weight_stays_tied_under_vmap(llm_files: dict[str, Path]) -> None:
    """Full fine-tuning of GPT-2: the embedding is federated once; its output use reads the same stacked tensor."""
    cfg = compose(overrides(llm_files, "none", "executor=vmap"))
    model = batchable_forward(build_model_factory(cfg, build_data(cfg))())
    names = ParamLayout.of(model).names
    assert any(n.endswith("wte.weight") for n in names) and not any(n.endswith("lm_head.weight") for n in names)
    x = torch.randint(0, 10, (2, SEQ_LEN))
    weights = {n: p.detach() for n, p in model.named_parameters()}
    doubled = {n: (2 * v if n.endswith("wte.weight") else v) for n, v in weights.items()}
    logits = torch.func.functional_call(model, doubled, (x,))
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(doubled[n])  # lm_head.weight is the same Parameter: doubled with it
        expected = model(x)
    assert torch.equal(logits, expected)


@pytest.mark.parametrize(
    ("extra", "module"), [("adapter.dropout=0.1", "lora_dropout"), ("model.dropout=0.1", "transformer.drop")]
)
def test_dropout_is_refused_in_one_line(extra: str, module: str, llm_files: dict[str, Path]) -> None:
    """(The command line's one line and exit status: tests/llm/test_lora_runs.py.)"""
    cfg = compose(overrides(llm_files, "lora", extra))
    with pytest.raises(VmapUnsupportedError, match=rf"cannot vectorise dropout \(\S*{module}\S*: p=0.1;"):
        check_model(build_model_factory(cfg, build_data(cfg))())
