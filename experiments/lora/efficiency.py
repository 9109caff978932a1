"""The efficiency ratio of federated LoRA: the wall time of a round of ``experiment=lora_tiny`` against centralized
LoRA fine-tuning of the same tokens, timed side by side in one process.

Federated: ``experiment=lora_tiny`` (FedIT: LoRA on c_attn, FedAvg) for ``--rounds`` rounds under ``--executor``
(serial: one thread in this process; process: 2 worker processes of one thread), no evaluation before the last
round; a round's time is ``time/round_s`` (sampling, dispatch, the clients' training, aggregation, metrics).
Centralized: one model built by the same factory (the same base and adapters), one Adam optimizer kept across
rounds, one thread; for each federated round, the same number of optimizer steps (``sum_k ceil(n_k / B)`` over the
round's clients) in batches of ``B`` over the union of that round's clients' training windows. The first and last
rounds are left out of both (the first pays first calls, the last the evaluation); the ratio is of the medians.
Usage: python experiments/lora/efficiency.py [--rounds 12] [--executor serial|process]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from fedsim.run import build_data, build_model_factory, compose, run_config


def centralized_round(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    batch_size: int,
    generator: torch.Generator,
) -> float:
    """``steps`` Adam steps on batches of the shuffled rows ``x, y`` (token loss, -100 ignored); the seconds taken."""
    start = time.perf_counter()
    order = torch.randperm(len(x), generator=generator)
    model.train()
    for step in range(steps):
        rows = order[(torch.arange(batch_size) + step * batch_size) % len(x)]
        logits = model(x[rows])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[rows].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--executor", choices=["serial", "process"], default="serial")
    parser.add_argument("--run-root", type=Path, default=Path("/tmp/fedsim_lora_efficiency"))
    args = parser.parse_args()
    executor = ["executor=serial"] if args.executor == "serial" else ["executor=process", "executor.workers=2"]
    cfg = compose(["experiment=lora_tiny", *executor, "logger=quiet", f"num_rounds={args.rounds}", "eval_every=1000"])
    run_root = args.run_root / time.strftime("%Y%m%d-%H%M%S")
    run_config(compose(["experiment=lora_tiny", "num_rounds=1", "logger=quiet"]), run_root / "warm-up")
    run_config(cfg, run_root / "federated")
    metrics = (run_root / "federated" / "metrics.jsonl").read_text().splitlines()
    history = [json.loads(line) for line in metrics]  # with each round's clients, which RunResult.history lacks
    data = build_data(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model_factory(cfg, data)()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=cfg.client.optimizer.lr)
    batch = cfg.client.batch_size
    generator = torch.Generator().manual_seed(cfg.seed)
    torch.set_num_threads(1)
    federated, centralized, steps_per_round = [], [], []
    for record in history[1:-1]:
        rows = torch.from_numpy(np.concatenate([data.client_train[c["client_id"]] for c in record["clients"]]))
        steps = sum(math.ceil(c["num_examples"] / batch) * cfg.client.epochs for c in record["clients"])
        centralized.append(
            centralized_round(model, optimizer, data.train.x[rows], data.train.y[rows], steps, batch, generator)
        )
        federated.append(record["time/round_s"])
        steps_per_round.append(steps)
    fed, cen = statistics.median(federated), statistics.median(centralized)
    print(f"executor={args.executor}, {len(federated)} rounds timed, {steps_per_round[0]} optimizer steps a round")
    print(
        f"federated LoRA round (time/round_s), median: {fed * 1000:.1f} ms   (fit part: "
        f"{statistics.median(r['time/fit_s'] for r in history[1:-1]) * 1000:.1f} ms)"
    )
    print(f"centralized LoRA, same steps and tokens, median: {cen * 1000:.1f} ms")
    print(f"efficiency ratio (federated / centralized): {fed / cen:.2f}")


if __name__ == "__main__":
    main()
