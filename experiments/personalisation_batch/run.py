"""Per-batch personalisation on a label-skewed split: APFL, pFedMe, Per-FedAvg and MOON against Ditto and FedAvg.

The split of experiments/personalisation (Synthetic(0,0) from 100 devices, pooled and re-split over 50 clients by a
Dirichlet(0.1) label skew) with the 2NN, fewer rounds to fit the shared 2-core machine. Every client is scored on its
local test split at the last round with the global model (``eval_global/``) and its personal model
(``eval_personal/``).
Usage: python experiments/personalisation_batch/run.py [--rounds 20] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from fedsim.run import compose, run_config

SETTING = [
    "data=synthetic",
    "data.alpha=0",
    "data.beta=0",
    "data.num_devices=100",
    "partition=dirichlet",
    "partition.alpha=0.1",
    "partition.num_clients=50",
    "model=mlp",
    "clients_per_round=10",
    "client.epochs=1",
    "client.batch_size=10",
    "client.optimizer.lr=0.05",
    "evaluate_clients=all",
    "executor=process",
    "executor.devices=cpu",
    "executor.workers=2",
    "logger=quiet",
]
CONFIGS = {
    "FedAvg": ["strategy=fedavg"],
    "Ditto": ["strategy=ditto", "strategy.lam=0.1"],
    "APFL": ["strategy=apfl", "strategy.alpha=0.25", "strategy.adapt_alpha=true"],
    "pFedMe": ["strategy=pfedme"],  # λ = 15, K = 5, personal lr 0.01, β = 1
    "Per-FedAvg (FO)": ["strategy=perfedavg"],  # α = 0.01, β = the client's lr (0.05)
    "Per-FedAvg (HF)": ["strategy=perfedavg", "strategy.variant=hf"],  # and δ = 0.001
    "MOON": ["strategy=moon"],  # μ = 1, τ = 0.5
}
KEYS = ["eval_global/accuracy_mean", "eval_global/accuracy_worst10", "eval_personal/accuracy_mean"]
KEYS += ["eval_personal/accuracy_worst10", "fit/apfl_alpha", "fit/moon_contrastive"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    parser.add_argument("--run-root", type=Path, default=Path("/tmp/fedsim_personalisation_batch"))
    args = parser.parse_args()
    start, run_root = time.perf_counter(), args.run_root / time.strftime("%Y%m%d-%H%M%S")
    runs: dict[str, dict[int, dict]] = {name: {} for name in CONFIGS}
    for seed in args.seeds:
        for name, overrides in CONFIGS.items():
            cfg = compose(
                SETTING + overrides + [f"num_rounds={args.rounds}", f"eval_every={args.rounds}", f"seed={seed}"]
            )
            t0 = time.perf_counter()
            final = run_config(cfg, run_root / f"{name}-seed{seed}").history[-1]
            runs[name][seed] = {k: final[k] for k in KEYS if k in final} | {"wall_time_s": time.perf_counter() - t0}
            print(f"seed {seed} {name:15s} {runs[name][seed]}", flush=True)
    summary = {name: _mean_std(per_seed) for name, per_seed in runs.items()}
    wall = time.perf_counter() - start
    result = {"setting": SETTING, "configs": CONFIGS, "rounds": args.rounds, "seeds": args.seeds}
    result |= {"summary_mean_std_over_seeds": summary, "runs": runs, "wall_time_s": wall}
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(_table(summary))
    print(f"total wall time {wall:.0f} s")


def _mean_std(per_seed: dict[int, dict]) -> dict[str, list[float]]:
    """[mean, sample std] over seeds of every final value."""
    out = {}
    for key in next(iter(per_seed.values())):
        values = [run[key] for run in per_seed.values()]
        out[key] = [statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0]
    return out


def _table(summary: dict[str, dict[str, list[float]]]) -> str:
    def cell(stats: dict, key: str) -> str:
        return f"{stats[key][0]:.3f} ± {stats[key][1]:.3f}" if key in stats else "–"

    rows = ["| method | personal acc. mean | personal worst 10 % | global acc. mean | global worst 10 % | s per run |"]
    rows.append("|---|---|---|---|---|---|")
    for name, s in summary.items():
        rows.append(
            f"| {name} | {cell(s, 'eval_personal/accuracy_mean')} | {cell(s, 'eval_personal/accuracy_worst10')} "
            f"| {cell(s, 'eval_global/accuracy_mean')} | {cell(s, 'eval_global/accuracy_worst10')} "
            f"| {s['wall_time_s'][0]:.0f} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    main()
