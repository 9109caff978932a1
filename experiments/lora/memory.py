"""Memory of one worker training LoRA adapters on a GPT-2-small-shaped model, per precision setting.

Each setting runs in a fresh interpreter (so that one setting's freed memory does not hide the next one's peak):
it builds ``fedsim.models.hf_lm.hf_causal_lm`` (12 layers, hidden size 768, 12 heads, vocabulary 50,257: GPT-2
small's shape, initialised from the seed; nothing is downloaded) with ``model.dtype`` and
``model.gradient_checkpointing``, applies LoRA (r = 8 on ``c_attn``, as the docs' examples), and trains one batch
as a client does (``Client.objective`` with ``client.autocast``, backward, an Adam step). It reports:

* ``base_mib`` / ``adapter_mib``: the bytes of the frozen and of the trainable parameters (exact);
* on CPU, ``held_mib``: the resident memory the built model adds (VmRSS after building minus before), and
  ``step_peak_mib``: the peak resident memory of the training step above what was held before it (the kernel's
  VmHWM, reset through /proc/self/clear_refs just before the step): activations, logits, gradients, Adam's state;
* on a GPU (``--device cuda:0``), ``held_mib``: ``torch.cuda.memory_allocated`` after building, and
  ``step_peak_mib``: ``torch.cuda.max_memory_allocated`` during the step minus that.

A worker's memory for a run is about its imports (``imports_mib``) + ``held_mib`` + ``step_peak_mib``; the
activations (most of the step's peak) grow with ``client.batch_size`` × the sequence length.

    python experiments/lora/memory.py                      # CPU, batch 2 x 256 tokens; writes memory.json
    python experiments/lora/memory.py --device cuda:0 --batch 8 --seq 512 --out memory_gpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SETTINGS = {
    "float32": ("float32", False, None),
    "float32_checkpointing": ("float32", True, None),
    "float32_autocast_bf16": ("float32", False, "bfloat16"),
    "bfloat16": ("bfloat16", False, None),
    "bfloat16_checkpointing": ("bfloat16", True, None),
    "bfloat16_checkpointing_autocast": ("bfloat16", True, "bfloat16"),
    "float16": ("float16", False, None),
}
DEFAULT = [name for name in SETTINGS if name != "float16"]  # float16 matmuls are slow on most CPUs


def _status_mib(field: str) -> float:
    """A ``/proc/self/status`` memory field (VmRSS, VmHWM) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(setting: str, device: str, batch: int, seq: int) -> dict[str, object]:
    """One setting, in this interpreter (see the module's docstring)."""
    import torch

    from fedsim.client.base import Client
    from fedsim.models.hf_lm import LoRA, hf_causal_lm

    dtype, checkpointing, autocast = SETTINGS[setting]
    cuda = device.startswith("cuda")
    tiny = hf_causal_lm(input_shape=(8,), num_classes=16, hidden_size=8, num_heads=1, num_layers=1)
    LoRA(r=1, target_modules=["c_attn"]).apply(tiny)  # transformers' and PEFT's lazy imports happen here: not counted
    del tiny
    imports = _status_mib("VmRSS")
    before = torch.cuda.memory_allocated(device) / 2**20 if cuda else imports
    size = {"model_type": "gpt2", "num_layers": 12, "hidden_size": 768, "num_heads": 12, "vocab_size": 50257}
    knobs = {"dtype": dtype, "gradient_checkpointing": checkpointing}
    model = hf_causal_lm(input_shape=(seq,), num_classes=50257, **size, **knobs)
    model = LoRA(r=8, target_modules=["c_attn"]).apply(model).to(device).train()
    held = (torch.cuda.memory_allocated(device) / 2**20 if cuda else _status_mib("VmRSS")) - before
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=1e-3)
    client = Client(0, [0], autocast=autocast)
    x = torch.randint(0, 50257, (batch, seq), generator=torch.Generator().manual_seed(0)).to(device)
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base_of_step = torch.cuda.memory_allocated(device) / 2**20
    else:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        base_of_step = _status_mib("VmRSS")
    began = time.perf_counter()
    loss = client.objective(model, x, x)
    loss.backward()
    optimizer.step()
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - began
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else _status_mib("VmHWM")
    return {
        "setting": setting,
        "model.dtype": dtype,
        "model.gradient_checkpointing": checkpointing,
        "client.autocast": autocast,
        "base_mib": sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad) / 2**20,
        "adapter_mib": sum(p.numel() * p.element_size() for p in trainable) / 2**20,
        "imports_mib": imports,
        "held_mib": held,
        "step_peak_mib": peak - base_of_step,
        "step_s": seconds,
        "loss": float(loss),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=2, help="client.batch_size")
    parser.add_argument("--seq", type=int, default=256, help="tokens a row (data.seq_len)")
    parser.add_argument("--settings", default=",".join(DEFAULT), help=f"comma-separated, of {', '.join(SETTINGS)}")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each setting's interpreter")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("memory.json"))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child interpreter: measure this setting, print JSON
    args = parser.parse_args()
    if args.one:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(measure(args.one, args.device, args.batch, args.seq)))
        return
    names = args.settings.split(",")
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        parser.error(f"--settings: unknown {', '.join(unknown)} (choose from {', '.join(SETTINGS)})")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    rows = []
    for name in names:
        child = [sys.executable, __file__, "--one", name, "--device", args.device, "--batch", str(args.batch)]
        done = subprocess.run(
            [*child, "--seq", str(args.seq), "--threads", str(args.threads)], env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            sys.exit(f"{name}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in rows[-1].items()))
    shape = {"device": args.device, "batch": args.batch, "seq": args.seq, "threads": args.threads}
    args.out.write_text(json.dumps({**shape, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
