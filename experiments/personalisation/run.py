"""Personalised vs global accuracy on a label-skewed split: FedAvg, FedPer, FedRep and Ditto, 3 seeds.

Synthetic(0,0) from 100 devices, pooled and re-split over 50 clients by a Dirichlet(0.1) label skew; the 2NN
(MLP, two hidden layers of 200). Every client is scored on its local test split at the evaluation rounds
(``evaluate_clients=all``) with the global model (``eval_global/``) and, for the personalised methods, with its
personal model (``eval_personal/``).
Usage: python experiments/personalisation/run.py [--rounds 30] [--seeds 0 1 2] [--out experiments/personalisation]
Needs matplotlib for the plot (pip install -e '.[plot]'); without it the plot is skipped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from fedsim.run import build_data, compose, run_config

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
    "eval_every=5",
    "executor=process",
    "executor.devices=cpu",
    "executor.workers=2",
    "logger=quiet",
]
CONFIGS = {
    "FedAvg": ["strategy=fedavg"],
    "FedPer": ["strategy=fedper"],  # personal layer: the last Linear (the classifier)
    "FedRep": ["strategy=fedrep", "strategy.head_epochs=2"],  # 2 head epochs, then 1 body epoch
    "Ditto": ["strategy=ditto", "strategy.lam=0.1"],  # 1 personal epoch per round (the round's epochs)
}
KEYS = [  # final-round values kept per run
    "eval_global/accuracy",
    "eval_global/accuracy_mean",
    "eval_global/accuracy_std",
    "eval_global/accuracy_p10",
    "eval_global/accuracy_worst10",
    "eval_personal/accuracy",
    "eval_personal/accuracy_mean",
    "eval_personal/accuracy_std",
    "eval_personal/accuracy_p10",
    "eval_personal/accuracy_worst10",
    "eval_personal/personalised",
    "eval_global/clients",
    "eval/accuracy",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    parser.add_argument("--run-root", type=Path, default=Path("/tmp/fedsim_personalisation"))
    args = parser.parse_args()
    start = time.perf_counter()
    run_root = args.run_root / time.strftime("%Y%m%d-%H%M%S")  # a fresh directory per invocation
    runs: dict[str, dict[int, dict]] = {name: {} for name in CONFIGS}
    curves: dict[str, dict[int, list]] = {name: {} for name in CONFIGS}
    skew = {}
    for seed in args.seeds:
        for name, overrides in CONFIGS.items():
            cfg = compose(SETTING + overrides + [f"num_rounds={args.rounds}", f"seed={seed}"])
            if name == "FedAvg":
                skew[seed] = _label_skew(cfg)
            t0 = time.perf_counter()
            history = run_config(cfg, run_root / f"{name}-seed{seed}").history
            final = [r for r in history if "eval_global/accuracy_mean" in r][-1]
            runs[name][seed] = {k: final[k] for k in KEYS if k in final} | {
                "round": final["round"],
                "wall_time_s": time.perf_counter() - t0,
            }
            curves[name][seed] = [
                (r["round"], r["eval_global/accuracy_mean"], r.get("eval_personal/accuracy_mean"))
                for r in history
                if "eval_global/accuracy_mean" in r
            ]
            personal = runs[name][seed].get("eval_personal/accuracy_mean", float("nan"))
            print(
                f"seed {seed} {name:7s} global mean {runs[name][seed]['eval_global/accuracy_mean']:.4f}  "
                f"personal mean {personal:.4f}  ({runs[name][seed]['wall_time_s']:.0f} s)",
                flush=True,
            )
    summary = {name: _mean_std(per_seed) for name, per_seed in runs.items()}
    wall = time.perf_counter() - start
    result = {
        "setting": SETTING,
        "configs": CONFIGS,
        "rounds": args.rounds,
        "seeds": args.seeds,
        "label_skew": skew,
        "summary_mean_std_over_seeds": summary,
        "runs": runs,
        "curves": curves,
        "wall_time_s": wall,
    }
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(_table(summary))
    print(f"total wall time {wall:.0f} s")
    _plot(curves, args.out / "personalisation.png")


def _label_skew(cfg) -> dict[str, float]:
    """How skewed the clients' training labels are: mean number of classes with ≥ 5 % of a client's examples,
    and the mean share of a client's most frequent class."""
    import numpy as np

    data = build_data(cfg)
    counts = [np.bincount(data.train.labels[idx], minlength=data.train.num_classes) for idx in data.client_train]
    shares = [c / c.sum() for c in counts]
    return {
        "clients": len(counts),
        "train_examples_mean": float(np.mean([c.sum() for c in counts])),
        "train_examples_min": int(min(c.sum() for c in counts)),
        "classes_ge5pct_mean": float(np.mean([(s >= 0.05).sum() for s in shares])),
        "top_class_share_mean": float(np.mean([s.max() for s in shares])),
    }


def _mean_std(per_seed: dict[int, dict]) -> dict[str, list[float]]:
    """[mean, sample std] over seeds of every final value."""
    keys = next(iter(per_seed.values())).keys()
    out = {}
    for key in keys:
        values = [run[key] for run in per_seed.values()]
        out[key] = [statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0]
    return out


def _table(summary: dict[str, dict[str, list[float]]]) -> str:
    def cell(stats: dict, key: str) -> str:
        return f"{stats[key][0]:.3f} ± {stats[key][1]:.3f}" if key in stats else "–"

    rows = [
        "| method | personal acc. mean | personal worst 10 % | personal p10 | global model acc. mean "
        "| global worst 10 % | clients with a personal model |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, stats in summary.items():
        count = f"{stats['eval_personal/personalised'][0]:.1f} / 50" if "eval_personal/personalised" in stats else "–"
        rows.append(
            f"| {name} | {cell(stats, 'eval_personal/accuracy_mean')} "
            f"| {cell(stats, 'eval_personal/accuracy_worst10')} "
            f"| {cell(stats, 'eval_personal/accuracy_p10')} | {cell(stats, 'eval_global/accuracy_mean')} "
            f"| {cell(stats, 'eval_global/accuracy_worst10')} | {count} |"
        )
    return "\n".join(rows)


def _plot(curves: dict[str, dict[int, list]], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, (name, per_seed) in enumerate(curves.items()):
        color = f"C{i}"
        for j, points in enumerate(per_seed.values()):
            rounds = [p[0] for p in points]
            ax.plot(
                rounds,
                [p[1] for p in points],
                color=color,
                ls=":",
                lw=1,
                label=f"{name} global model" if j == 0 and name != "FedAvg" else None,
            )
            if name == "FedAvg":
                ax.plot(
                    rounds, [p[1] for p in points], color=color, lw=1.5, label="FedAvg (global)" if j == 0 else None
                )
            elif points[0][2] is not None:
                ax.plot(
                    rounds, [p[2] for p in points], color=color, lw=1.5, label=f"{name} personal" if j == 0 else None
                )
    ax.set(
        xlabel="round",
        ylabel="mean client accuracy (local test splits)",
        title="Synthetic(0,0), Dirichlet α=0.1 over 50 clients, 2NN",
    )
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
