"""FedProx vs FedAvg on Synthetic(1,1) with 90% stragglers (Li et al., MLSys 2020, Figure 1 setting).

Runs three configurations through fedsim's own config path and writes metrics, a plot and a table:
  FedAvg (drops stragglers), FedProx mu=0 (keeps stragglers' partial work), FedProx mu=1.
Usage: python experiments/fedprox_synthetic/run.py [--rounds 100] [--out experiments/fedprox_synthetic]
Needs matplotlib for the plot (pip install -e '.[plot]').
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedsim.run import compose, run_config

SETTING = [
    "data=synthetic",
    "data.alpha=1",
    "data.beta=1",
    "model=logreg",
    "clients_per_round=10",
    "client.epochs=20",
    "client.batch_size=10",
    "client.optimizer.lr=0.01",
    "stragglers.fraction=0.9",
    "executor=process",
    "executor.devices=cpu",
    "logger=quiet",
]
CONFIGS = {
    "FedAvg (drop stragglers)": ["strategy=fedavg"],
    "FedProx mu=0": ["strategy=fedprox", "strategy.mu=0"],
    "FedProx mu=1": ["strategy=fedprox", "strategy.mu=1"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    histories = {}
    for name, overrides in CONFIGS.items():
        cfg = compose(SETTING + overrides + [f"num_rounds={args.rounds}", f"seed={args.seed}"])
        histories[name] = run_config(cfg).history
        last = histories[name][-1]
        print(f"{name:26s} final train loss {last['train/loss']:.4f}  test accuracy {last['eval/accuracy']:.4f}")
    (args.out / "results.json").write_text(json.dumps(_summary(histories), indent=2) + "\n")
    _plot(histories, args.out / "fedprox_synthetic.png")


def _summary(histories: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Final and best test accuracy and mean train loss over the last 10 rounds of each run."""
    out = {}
    for name, history in histories.items():
        tail = history[-10:]
        out[name] = {
            "final_accuracy": history[-1]["eval/accuracy"],
            "best_accuracy": max(r["eval/accuracy"] for r in history),
            "mean_train_loss_last10": sum(r["train/loss"] for r in tail) / len(tail),
            "mean_test_loss_last10": sum(r["eval/loss"] for r in tail) / len(tail),
        }
    return out


def _plot(histories: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    for name, history in histories.items():
        rounds = [r["round"] for r in history]
        ax_loss.plot(rounds, [r["eval/loss"] for r in history], label=name)
        ax_acc.plot(rounds, [r["eval/accuracy"] for r in history], label=name)
    ax_loss.set(xlabel="round", ylabel="test loss", title="Synthetic(1,1), 90% stragglers")
    ax_acc.set(xlabel="round", ylabel="test accuracy")
    ax_acc.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
