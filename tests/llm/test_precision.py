"""A language model's memory knobs (fedsim/models/precision.py, client.autocast): the frozen base in bfloat16 or
float16 with float32 adapters and logits, transformers' gradient checkpointing (the same gradients, bit for bit),
autocast around the forward pass and the loss, a LoRA run with all three from the command line (serial = process
bitwise; a resume with another model.dtype refused in one line), the float32 default unchanged, and the one-line
refusals where an executor cannot honour them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli
from test_fedsa_upload import fedsa_args

from fedsim.cli.run import build_server, compose
from fedsim.client.base import Client
from fedsim.core.checkpoint import load_latest
from fedsim.core.params import ParamLayout, checkpoints_activations
from fedsim.models.hf_lm import LoRA, hf_causal_lm, hf_seq_cls

pytest.importorskip("peft")  # with transformers: imported once when collected, not inside the first test's time

SIZE = {"input_shape": (8,), "num_classes": 20, "hidden_size": 16, "num_layers": 2, "num_heads": 2, "seed": 0}


def lora(model: torch.nn.Module) -> torch.nn.Module:
    return LoRA(r=4, target_modules=["c_attn"]).apply(model)


def base_bytes(model: torch.nn.Module) -> int:
    """Bytes of the frozen parameters (the base a worker holds besides the adapters)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_precision_base_keeps_float32_adapters_and_logits(dtype: str) -> None:
    full, half = lora(hf_causal_lm(**SIZE)), lora(hf_causal_lm(**SIZE, dtype=dtype))
    assert {p.dtype for p in half.parameters() if not p.requires_grad} == {getattr(torch, dtype)}
    assert {p.dtype for p in half.parameters() if p.requires_grad} == {torch.float32}
    assert base_bytes(half) * 2 == base_bytes(full)  # 2 bytes a weight instead of 4
    trainable = [(n, p.shape) for n, p in full.named_parameters() if p.requires_grad]
    assert [(n, p.shape) for n, p in half.named_parameters() if p.requires_grad] == trainable
    x = torch.randint(0, 20, (3, 8))
    logits = half(x)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    nn_loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x)
    nn_loss.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in half.parameters() if p.requires_grad)


def test_a_classifier_head_copied_from_a_half_precision_base_trains_in_float32() -> None:
    model = lora(hf_seq_cls(**{**SIZE, "num_classes": 3}, vocab_size=20, dtype="bfloat16"))
    head = [n for n, p in model.named_parameters() if p.requires_grad and "score" in n]
    assert head and all(dict(model.named_parameters())[n].dtype == torch.float32 for n in head)
    scores = model(torch.randint(1, 20, (4, 8)))
    assert scores.shape == (4, 3) and scores.dtype == torch.float32


def test_the_float32_default_casts_nothing_and_hooks_nothing() -> None:
    model = lora(hf_causal_lm(**SIZE))
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert not any(m._forward_pre_hooks for m in model.modules()) and not checkpoints_activations(model)
    again = lora(hf_causal_lm(**SIZE, dtype="float32", gradient_checkpointing=False))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True))


def test_gradient_checkpointing_changes_no_gradient() -> None:
    x = torch.randint(0, 20, (4, 8))
    grads = []
    for checkpointing in (False, True):
        model = lora(hf_causal_lm(**SIZE, gradient_checkpointing=checkpointing)).train()
        assert checkpoints_activations(model) is checkpointing
        torch.nn.functional.cross_entropy(model(x).transpose(1, 2), x).backward()
        grads.append([p.grad for p in model.parameters() if p.requires_grad])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))  # recomputed activations are the same ones


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_autocast_runs_the_forward_pass_and_loss_in_it(dtype: str) -> None:
    model = lora(hf_causal_lm(**SIZE))
    seen: list[torch.dtype] = []
    model.lm.base_model.model.lm_head.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    x = torch.randint(0, 20, (2, 8))
    plain, cast = Client(0, [0, 1]), Client(0, [0, 1], autocast=dtype)
    plain.objective(model, x, x)
    loss = cast.objective(model, x, x)
    assert seen == [torch.float32, getattr(torch, dtype)] and loss.dtype == torch.float32
    loss.backward()  # outside the autocast region
    assert all(p.grad.dtype == torch.float32 for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: hf_causal_lm(**SIZE, dtype="float64"), r"^model.dtype must be one of float32, bfloat16, float16 \("),
        (lambda: hf_causal_lm(**SIZE, gradient_checkpointing="yes"), r"^model.gradient_checkpointing must be true or"),
        (lambda: Client(0, [0], autocast="float32"), r"^client.autocast must be null, bfloat16 or float16 \(got 'fl"),
    ],
)
def test_bad_values_are_one_line(build: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()  # type: ignore[operator]


def metrics(run_dir: Path) -> list[dict]:
    """Every round's record without times and without the name of the worker that trained each client."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        for row in record.get("clients", []):
            row.pop("worker")
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "system/"))} for r in records]


@pytest.mark.slow
def test_a_bfloat16_lora_run_with_checkpointing_and_autocast_is_bitwise_equal_serial_and_process(
    llm_files: dict[str, Path], tmp_path: Path
) -> None:
    knobs = ["model.dtype=bfloat16", "model.gradient_checkpointing=true", "client.autocast=bfloat16"]
    base = [*fedsa_args(llm_files, "strategy=fedavg", "num_rounds=2", "evaluate_clients=all"), "logger.progress=false"]
    for executor in ("serial", "process"):
        done = run_cli([*base, *knobs, f"executor={executor}", f"hydra.run.dir={tmp_path / executor}"])
        assert done.returncode == 0, done.stderr
    serial, process = (load_latest(tmp_path / e / "checkpoints")[1]["params"] for e in ("serial", "process"))
    assert serial.dtype == torch.float32 and torch.equal(serial, process)
    assert metrics(tmp_path / "serial") == metrics(tmp_path / "process")  # losses, perplexities, every client's
    evaluated = [sorted((tmp_path / e / "client_eval").iterdir()) for e in ("serial", "process")]
    assert [p.read_text() for p in evaluated[0]] == [p.read_text() for p in evaluated[1]] and evaluated[0]
    plain = run_cli([*base, f"hydra.run.dir={tmp_path / 'float32'}"])
    assert plain.returncode == 0, plain.stderr
    reference = load_latest(tmp_path / "float32" / "checkpoints")[1]["params"]
    assert reference.shape == serial.shape and not torch.equal(reference, serial)  # bfloat16 did change the sums
    other = [*base, *knobs[1:], "model.dtype=float32", "num_rounds=3", "resume=true"]
    refused = run_cli([*other, f"hydra.run.dir={tmp_path / 'serial'}"])
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert "model.dtype ('bfloat16' -> 'float32')" in lines[0] and "resume_allow_changes=[model.dtype]" in lines[0]
    assert len(metrics(tmp_path / "serial")) == 2  # nothing ran


@pytest.mark.slow
def test_vmap_trains_float32_adapters_on_a_bfloat16_base(llm_files: dict[str, Path], tmp_path: Path) -> None:
    """executor=vmap stacks the float32 adapters per client and uses the bfloat16 base unbatched (it refuses only
    checkpointing and autocast): the run ends with float32 adapters that moved and a finite perplexity."""
    base = [*fedsa_args(llm_files, "strategy=fedavg", "num_rounds=2"), "logger.progress=false", "executor=vmap"]
    done = run_cli([*base, "model.dtype=bfloat16", f"hydra.run.dir={tmp_path / 'vmap'}"])
    assert done.returncode == 0, done.stderr
    params = load_latest(tmp_path / "vmap" / "checkpoints")[1]["params"]
    server = build_server(compose([*base, "model.dtype=bfloat16"]))  # the run's initial model, not run
    layout = ParamLayout.of(server.model)
    b_rows = layout.mask(layout.matching(r"\.lora_B\."))
    assert params.dtype == torch.float32 and params.shape == server.params.shape and bool(b_rows.any())
    assert not server.params[b_rows].any() and params[b_rows].any()  # B starts at zero: the adapters were trained
    assert all(math.isfinite(r["eval/perplexity"]) for r in metrics(tmp_path / "vmap")) and metrics(tmp_path / "vmap")
