"""A federated LoRA run on one device with the memory knobs of docs/language-models.md: FedIT (FedAvg on the
adapters) of ``experiment=lora_tiny``'s task (``synthetic_text``: 20 clients' Markov-chain text, a 2-layer GPT-2 of
hidden size 64 from the seed, LoRA r = 8 on ``c_attn``, Adam lr 0.01, 5 clients a round), run twice on ``--device``
with the serial executor: plain float32, and a bfloat16 base with gradient checkpointing and bfloat16 autocast
(``model.dtype=bfloat16 model.gradient_checkpointing=true client.autocast=bfloat16``). Built through the Python API
(no Hydra: the GPU image has none). Prints each run's test perplexity, its time and, on a GPU, its peak memory, and
one JSON line; exits 1 unless both runs end with a finite perplexity below their first round's.

    python experiments/gpu/lora_run.py --device cuda:0      # experiments/gpu/run_gpu_checks.sh's `lora` step
    python experiments/gpu/lora_run.py --device cpu         # the same on CPU (the script's --smoke run)
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # fedsim from this checkout

from fedsim.client.base import Client  # noqa: E402
from fedsim.client.federation import federate, make_clients  # noqa: E402
from fedsim.data.partition import natural  # noqa: E402
from fedsim.data.synthetic_text import synthetic_text  # noqa: E402
from fedsim.executor import SerialExecutor  # noqa: E402
from fedsim.models.hf_lm import LoRA, hf_causal_lm, with_adapter  # noqa: E402
from fedsim.observe.run_logger import RunLogger  # noqa: E402
from fedsim.server.server import Server  # noqa: E402
from fedsim.server.settings import Federation, Schedule  # noqa: E402
from fedsim.strategy import FedAvg  # noqa: E402

KNOBS = {"float32": ("float32", False, None), "bfloat16_checkpointing_autocast": ("bfloat16", True, "bfloat16")}


def run(device: str, rounds: int, dtype: str, checkpointing: bool, autocast: str | None) -> dict[str, object]:
    """One run (see the module's docstring); its final test perplexity, seconds and peak device memory."""
    data = federate(synthetic_text(seed=0), natural, client_test_fraction=0.0, seed=0)
    model = functools.partial(
        with_adapter,
        hf_causal_lm,
        LoRA(r=8, alpha=16, target_modules=("c_attn",)),
        input_shape=data.train.input_shape,
        num_classes=data.train.num_classes,
        dtype=dtype,
        gradient_checkpointing=checkpointing,
    )
    adam = functools.partial(torch.optim.Adam, lr=0.01)
    client = functools.partial(Client, batch_size=10, optimizer=adam, autocast=autocast)
    server = Server(
        model_factory=model,
        federation=Federation(clients=make_clients(data, client), train_data=data.train, test_data=data.test),
        strategy=FedAvg(),
        executor=SerialExecutor(device=device),
        schedule=Schedule(num_rounds=rounds, clients_per_round=5),
        seed=0,
        logger=RunLogger(None, progress=False),
    )
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    began = time.perf_counter()
    history = server.run().history
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.startswith("cuda") else None
    first, last = history[0]["eval/perplexity"], history[-1]["eval/perplexity"]
    return {"first_perplexity": first, "perplexity": last, "seconds": time.perf_counter() - began, "peak_mib": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    results = {}
    for name, (dtype, checkpointing, autocast) in KNOBS.items():
        results[name] = run(args.device, args.rounds, dtype, checkpointing, autocast)
        print(f"{name}: " + ", ".join(f"{k} {v:.4g}" for k, v in results[name].items() if v is not None), flush=True)
    print(json.dumps({"device": args.device, "rounds": args.rounds, "runs": results}))
    for name, result in results.items():
        first, last = float(result["first_perplexity"]), float(result["perplexity"])  # type: ignore[arg-type]
        if not (math.isfinite(last) and last < first):
            sys.exit(f"{name} did not learn: test perplexity {first:.4g} after round 1, {last:.4g} at the end")


if __name__ == "__main__":
    main()
