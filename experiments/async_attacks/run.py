"""Synchronous FedAvg against asynchronous FedBuff under the same attacks, 20 % malicious clients, over 3 seeds.

Setting: experiments/robustness's (Synthetic(1, 1), IID over 20 clients, the 60-200-10 MLP, SGD lr 0.1, batch 20,
one local epoch), so its FedAvg column is comparable. Both see 400 client updates:
  FedAvg    20 rounds of all 20 clients (no clock)
  FedBuff   80 server steps of buffer_size=5 updates, concurrency=10, on clock=sampled (Nguyen et al., AISTATS 2022)
  BASGD     20 server steps, each once all 10 buffers (client mod 10) hold an update, median of the buffer means,
            FedBuff's staleness weight, concurrency=10 (Yang and Li, ICML 2021): 14-15 updates a step here
Attacks at attack.fraction=0.2 (4 of the 20 clients, fixed for the run): none, sign_flip (scale 1), alie (z_max),
ipm (epsilon 0.5), ipm with epsilon 5, gaussian (std 1), backdoor. Under FedBuff the attack acts on each server
step's buffer (docs/attacks.md).
Usage: python experiments/async_attacks/run.py [--seeds 0 1 2]
Runs go to a temporary directory (removed at the end); writes results.json here and prints the README's table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from fedsim.run import compose, run_config

SETTING = [
    "model=mlp",
    "partition=iid",
    "partition.num_clients=20",
    "client.optimizer.lr=0.1",
    "client.batch_size=20",
    "executor=serial",
    "logger=quiet",
]
STRATEGIES = {
    "FedAvg": ["strategy=fedavg", "clients_per_round=20", "num_rounds=20"],
    "FedBuff (K=5, C=10)": [
        "strategy=fedbuff",
        "strategy.buffer_size=5",
        "strategy.concurrency=10",
        "clock=sampled",
        "num_rounds=80",
        "eval_every=4",
    ],
    "BASGD (B=10, C=10, median)": [
        "strategy=basgd",
        "strategy.num_buffers=10",
        "strategy.concurrency=10",
        "strategy.staleness_exponent=0.5",
        "clock=sampled",
        "num_rounds=20",
        "eval_every=2",
    ],
}
ATTACKS = {
    "none": ["attack=none"],
    "sign_flip": ["attack=sign_flip"],
    "alie": ["attack=alie"],
    "ipm ε=0.5": ["attack=ipm"],
    "ipm ε=5": ["attack=ipm", "attack.epsilon=5"],
    "gaussian σ=1": ["attack=gaussian"],
    "backdoor": ["attack=backdoor"],
}


def cell(values: list[float]) -> dict:
    return {
        "per_seed": values,
        "mean": statistics.mean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def table(results: dict, key: str, attacks: list[str]) -> str:
    lines = ["| strategy \\ attack | " + " | ".join(attacks) + " |", "|---" * (len(attacks) + 1) + "|"]
    for strategy, by_attack in results.items():
        cells = [f"{by_attack[a][key]['mean']:.4f} ± {by_attack[a][key]['std']:.4f}" for a in attacks]
        lines.append(f"| {strategy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    start = time.perf_counter()
    results: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="fedsim-async-attacks-") as tmp:
        for s_name, s_overrides in STRATEGIES.items():
            for a_name, a_overrides in ATTACKS.items():
                accuracy, backdoor, aggregated, updates = [], [], [], []
                for seed in args.seeds:
                    cfg = compose([*SETTING, *s_overrides, *a_overrides, f"seed={seed}"])
                    history = run_config(cfg, run_dir=Path(tmp) / f"{len(results)}-{a_name}-{seed}").history
                    accuracy.append(history[-1]["eval/accuracy"])
                    if "attack/backdoor_success" in history[-1]:
                        backdoor.append(history[-1]["attack/backdoor_success"])
                    aggregated.append(sum(r.get("attack/malicious_aggregated", 0.0) for r in history))
                    updates.append(sum(r["client/num_aggregated"] for r in history))
                    print(f"{s_name:20s} {a_name:14s} seed {seed}  accuracy {accuracy[-1]:.4f}", flush=True)
                results.setdefault(s_name, {})[a_name] = {
                    "accuracy": cell(accuracy),
                    "backdoor_success": cell(backdoor) if backdoor else None,
                    "malicious_updates_aggregated": aggregated,
                    "updates_aggregated": updates,
                }
    summary = {
        "command": "python experiments/async_attacks/run.py --seeds " + " ".join(map(str, args.seeds)),
        "setting": SETTING,
        "strategies": STRATEGIES,
        "attacks": ATTACKS,
        "results": results,
        "wall_s": time.perf_counter() - start,
    }
    (args.out / "results.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    print(table(results, "accuracy", list(ATTACKS)))
    print(table(results, "backdoor_success", ["backdoor"]))
    print(f"{summary['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
