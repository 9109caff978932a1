"""FedDyn and FedNova against FedAvg with heterogeneous local steps, on Synthetic(1,1), over 3 seeds.

Local steps differ between clients for two reasons: client sizes follow a power law (tau_k = E * ceil(n_k / B)
steps), and half of the sampled clients per round are stragglers that manage a random 1..E-1 epochs
(stragglers.fraction=0.5). Five configurations, each for every seed:
  FedAvg (drops stragglers)          strategy=fedavg (keeps_stragglers = False)
  FedAvg keeping stragglers          strategy=fedprox strategy.mu=0 (bitwise FedAvg, but keeps stragglers)
  FedNova                            strategy=fednova (keeps stragglers; normalises by tau_k)
  FedDyn alpha=0.01, alpha=0.1       strategy=feddyn (keeps stragglers)
Usage: python experiments/heterogeneous_steps/run.py [--rounds 50] [--seeds 0 1 2]
       [--out experiments/heterogeneous_steps]
Runs go to a temporary directory under /tmp that is removed at the end; writes results.json and (with
matplotlib) heterogeneous_steps.png into --out, and prints the README's table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

from fedsim.run import compose, run_config

EPOCHS = 10
SETTING = [
    "data=synthetic",
    "data.alpha=1",
    "data.beta=1",
    "model=logreg",
    "clients_per_round=10",
    f"client.epochs={EPOCHS}",
    "client.batch_size=10",
    "client.optimizer.lr=0.01",
    "stragglers.fraction=0.5",
    "evaluate_clients=all",
    "executor=serial",
    "logger=quiet",
]
CONFIGS = {
    "FedAvg (drops stragglers)": ["strategy=fedavg"],
    "FedAvg keeping stragglers (FedProx mu=0)": ["strategy=fedprox", "strategy.mu=0"],
    "FedNova": ["strategy=fednova", "strategy.server_lr=1.0"],
    "FedDyn alpha=0.01": ["strategy=feddyn", "strategy.alpha=0.01"],
    "FedDyn alpha=0.1": ["strategy=feddyn", "strategy.alpha=0.1"],
}
# Per-run numbers: (key in results.json, metric, how it is read from the history).
METRICS = [
    ("final_accuracy", "eval/accuracy", "final"),
    ("best_accuracy", "eval/accuracy", "max"),
    ("final_loss", "eval/loss", "final"),
    ("final_client_accuracy_mean", "eval_global/accuracy_mean", "final"),
    ("final_client_accuracy_worst10", "eval_global/accuracy_worst10", "final"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    start, cpu_start = time.perf_counter(), time.process_time()
    histories: dict[str, list[list[dict]]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="fedsim-heterogeneous-steps-", dir="/tmp") as tmp:
        for seed in args.seeds:
            for i, (name, overrides) in enumerate(CONFIGS.items()):
                cfg = compose(SETTING + overrides + [f"num_rounds={args.rounds}", f"seed={seed}"])
                run_start = time.perf_counter()
                history = run_config(cfg, run_dir=Path(tmp) / f"seed{seed}-{i}").history
                histories[name].append(history)
                last = history[-1]
                print(
                    f"seed {seed}  {name:42s} test acc {last['eval/accuracy']:.4f}  loss {last['eval/loss']:.4f}"
                    f"  ({time.perf_counter() - run_start:.1f} s)",
                    flush=True,
                )
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    results = _summary(histories, args, wall, cpu)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(_table(results))
    print(f"total wall time {wall:.0f} s (CPU time of this process {cpu:.0f} s)")
    try:
        _plot(results, args.out / "heterogeneous_steps.png")
    except ImportError:
        print("matplotlib is not installed: no plot (pip install -e '.[plot]')")


def _read(history: list[dict], metric: str, how: str) -> float:
    values = [r[metric] for r in history if metric in r]
    if not values:
        return math.nan
    return values[-1] if how == "final" else max(values)


def _mean_std(values: list[float]) -> dict[str, float]:
    """Mean and sample standard deviation (ddof 1) over seeds."""
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def _summary(histories: dict[str, list[list[dict]]], args: argparse.Namespace, wall: float, cpu: float) -> dict:
    methods = {}
    for name, runs in histories.items():
        per_seed = [{key: _read(h, metric, how) for key, metric, how in METRICS} for h in runs]
        rounds = [r["round"] for r in runs[0] if "eval/accuracy" in r]
        curves = {
            metric: [statistics.fmean(h[i][metric] for h in runs) for i in range(len(rounds))]
            for metric in ("eval/accuracy", "eval/loss")
        }
        curve_std = [
            statistics.stdev(h[i]["eval/accuracy"] for h in runs) if len(runs) > 1 else 0.0 for i in range(len(rounds))
        ]
        non_finite = sum(
            1 for h in runs for r in h for k in ("eval/loss", "train/loss") if k in r and not math.isfinite(r[k])
        )
        extra = {
            "mean_clients_aggregated": statistics.fmean(r["client/num_aggregated"] for h in runs for r in h),
            "non_finite_losses": non_finite,
        }
        if any("strategy/tau_eff" in r for h in runs for r in h):  # FedNova: sum_k p_k tau_k of the round
            extra["mean_tau_eff"] = statistics.fmean(
                r["strategy/tau_eff"] for h in runs for r in h if "strategy/tau_eff" in r
            )
        methods[name] = {
            "overrides": CONFIGS[name],
            "seeds": dict(zip(map(str, args.seeds), per_seed, strict=True)),
            **{key: _mean_std([s[key] for s in per_seed]) for key, _, _ in METRICS},
            **extra,
            "curve": {
                "round": rounds,
                "accuracy_mean": curves["eval/accuracy"],
                "accuracy_std": curve_std,
                "loss_mean": curves["eval/loss"],
            },
        }
    return {
        "setting": SETTING + [f"num_rounds={args.rounds}"],
        "seeds": args.seeds,
        "std": "sample standard deviation over seeds (ddof 1)",
        "wall_time_s": round(wall, 1),
        "cpu_time_s": round(cpu, 1),
        "methods": methods,
    }


def _table(results: dict) -> str:
    head = (
        "| method | final test acc | best test acc | final test loss | client acc mean (final) "
        "| client acc worst 10% (final) |"
    )
    lines = [head, "|---|---|---|---|---|---|"]
    for name, m in results["methods"].items():
        cells = [f"{m[key]['mean']:.3f} ± {m[key]['std']:.3f}" for key, _, _ in METRICS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, m in results["methods"].items():
        c = m["curve"]
        lo = [a - s for a, s in zip(c["accuracy_mean"], c["accuracy_std"], strict=True)]
        hi = [a + s for a, s in zip(c["accuracy_mean"], c["accuracy_std"], strict=True)]
        (line,) = ax_acc.plot(c["round"], c["accuracy_mean"], label=name)
        ax_acc.fill_between(c["round"], lo, hi, color=line.get_color(), alpha=0.15)
        ax_loss.plot(c["round"], c["loss_mean"], label=name)
    n = len(results["seeds"])
    ax_acc.set(xlabel="round", ylabel="test accuracy", title=f"mean over {n} seeds (band: ±1 std)")
    ax_loss.set(xlabel="round", ylabel="test loss", title="Synthetic(1,1), E=10, 50% stragglers", yscale="log")
    ax_acc.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
