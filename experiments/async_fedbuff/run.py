"""FedAvg, FedAvg with a deadline, and FedBuff on fedsim's simulated clock: time to a target accuracy, over 3 seeds.

Setting: Synthetic(1, 1) with 100 devices (one client each, heavy-tailed sizes), logistic regression, E = 2 local
epochs, batch 10, SGD lr 0.01; device profiles from `clock=sampled` (log-normal speed and bandwidths, sigma 1 in
log space: a ~50x spread between fast and slow devices), always online. The synchronous runs take --rounds rounds;
FedBuff takes --steps server steps of 10 updates each, enough to cover at least the same simulated time (its steps
are much shorter); the comparison is simulated time to the target accuracy, and the accuracy at the end.
  FedAvg                 strategy=fedavg, 10 clients per round: the round waits for its slowest client
  FedAvg + deadline      the same with clock.deadline_s (late clients dropped; FedAvg drops partial work)
  FedBuff                strategy=fedbuff buffer_size=10 concurrency=20 (Nguyen et al., AISTATS 2022)
With --availability, every client is online one window a period (clock.always_online=false: on average a quarter
of it; --period-h, default a day): the synchronous rounds sample among the online clients, FedBuff starts tasks
only on them, and a client whose window closes mid-task drops out (docs/system-heterogeneity.md).
Usage: python experiments/async_fedbuff/run.py [--rounds 60] [--steps 1200] [--seeds 0 1 2] [--targets 0.5 0.6 0.7]
       [--deadline 20] [--availability [--period-h 24]]
Runs go to a temporary directory (removed at the end); writes results.json (results_availability.json with
--availability) and prints the README's table.
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
    "data=synthetic",
    "data.num_devices=100",
    "model=logreg",
    "client.epochs=2",
    "client.batch_size=10",
    "client.optimizer.lr=0.01",
    "clock=sampled",
    "executor=serial",
    "logger=quiet",
    "clients_per_round=10",
]


def configs(deadline: float, rounds: int, steps: int) -> dict[str, list[str]]:
    return {
        "FedAvg": ["strategy=fedavg", f"num_rounds={rounds}"],
        f"FedAvg + deadline {deadline:g} s": [
            "strategy=fedavg",
            f"clock.deadline_s={deadline}",
            f"num_rounds={rounds}",
        ],
        "FedBuff (K=10, C=20)": [
            "strategy=fedbuff",
            "strategy.buffer_size=10",
            "strategy.concurrency=20",
            f"num_rounds={steps}",
            f"eval_every={max(1, steps // rounds)}",
        ],
    }


def availability(args: argparse.Namespace) -> list[str]:
    """The clock overrides of ``--availability`` (none without it)."""
    return ["clock.always_online=false", f"clock.period_h={args.period_h}"] if args.availability else []


def time_to(history: list[dict], target: float) -> float | None:
    """Simulated seconds until the test accuracy first reaches ``target`` (None: never)."""
    return next((r["sim/time_s"] for r in history if r.get("eval/accuracy", -1) >= target), None)


def summarise(histories: list[list[dict]], targets: list[float]) -> dict:
    to_target = {}
    for target in targets:
        times = [time_to(h, target) for h in histories]
        reached = [t for t in times if t is not None]
        to_target[str(target)] = {
            "per_seed_s": times,
            "reached": len(reached),
            "mean_s": statistics.mean(reached) if reached else None,
        }
    finals = [h[-1]["eval/accuracy"] for h in histories]
    return {
        "time_to_target": to_target,
        "final_accuracy": finals,
        "final_accuracy_mean": statistics.mean(finals),
        "final_accuracy_std": statistics.stdev(finals) if len(finals) > 1 else 0.0,
        "total_sim_time_s": [h[-1]["sim/time_s"] for h in histories],
        "dropped_deadline_per_round": statistics.mean(r.get("sim/dropped_deadline", 0.0) for h in histories for r in h),
        "dropped_offline_per_round": statistics.mean(r.get("sim/dropped_offline", 0.0) for h in histories for r in h),
    }


def table(results: dict, targets: list[float]) -> str:
    heads = " | ".join(f"simulated s to {t} (mean; seeds reaching)" for t in targets)
    lines = [
        f"| configuration | {heads} | final accuracy (mean ± std) | simulated s, whole run (per seed) | late clients "
        "dropped per round | gone offline per round |",
        "|---" * (len(targets) + 5) + "|",
    ]
    for name, r in results["configs"].items():
        cells = []
        for t in targets:
            entry = r["time_to_target"][str(t)]
            mean = "–" if entry["mean_s"] is None else f"{entry['mean_s']:.0f}"
            cells.append(f"{mean} ({entry['reached']}/{len(r['final_accuracy'])})")
        total = ", ".join(f"{t:.0f}" for t in r["total_sim_time_s"])
        lines.append(
            f"| {name} | {' | '.join(cells)} | {r['final_accuracy_mean']:.4f} ± {r['final_accuracy_std']:.4f} | "
            f"{total} | {r['dropped_deadline_per_round']:.2f} | {r['dropped_offline_per_round']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--targets", type=float, nargs="+", default=[0.5, 0.6, 0.7])
    parser.add_argument("--deadline", type=float, default=20.0)
    parser.add_argument("--availability", action="store_true", help="one online window a day per client")
    parser.add_argument("--period-h", type=float, default=24.0, help="with --availability: the period of the windows")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    start = time.perf_counter()
    histories: dict[str, list[list[dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="fedsim-fedbuff-") as tmp:
        for seed in args.seeds:
            for i, (name, overrides) in enumerate(configs(args.deadline, args.rounds, args.steps).items()):
                cfg = compose([*SETTING, *availability(args), *overrides, f"seed={seed}"])
                history = run_config(cfg, run_dir=Path(tmp) / f"s{seed}-{i}").history
                histories.setdefault(name, []).append(history)
                print(
                    f"seed {seed}  {name:24s} final acc {history[-1]['eval/accuracy']:.4f}  "
                    f"sim {history[-1]['sim/time_s']:.0f} s",
                    flush=True,
                )
    results = {
        "command": "python experiments/async_fedbuff/run.py "
        + " ".join(
            [
                f"--rounds {args.rounds}",
                f"--steps {args.steps}",
                "--seeds " + " ".join(map(str, args.seeds)),
                "--targets " + " ".join(map(str, args.targets)),
                f"--deadline {args.deadline:g}",
            ]
            + (["--availability", f"--period-h {args.period_h:g}"] if args.availability else [])
        ),
        "setting": SETTING + availability(args),
        "rounds": args.rounds,
        "steps": args.steps,
        "targets": args.targets,
        "deadline_s": args.deadline,
        "configs": {name: summarise(h, args.targets) for name, h in histories.items()},
        "wall_s": time.perf_counter() - start,
    }
    name = (
        "results.json"
        if not args.availability
        else "results_availability.json"
        if args.period_h == 24
        else f"results_availability_period{args.period_h:g}h.json"
    )
    (args.out / name).write_text(json.dumps(results, indent=2) + "\n")
    print(table(results, args.targets))


if __name__ == "__main__":
    main()
