"""DP-FedAvg: test accuracy against ε for no DP, fixed clipping at several noise multipliers and adaptive clipping.

Setting: Synthetic(1, 1) data from 100 device distributions, dealt IID to 2,000 users (`partition=iid`), so that
user-level DP has many users; 100 users expected per round (Poisson sampling, q = 0.05), multinomial logistic
regression, E = 1 local epoch, batch 10, SGD lr 0.05, FedAvg (server lr 1), δ = 1e-6.
  no DP                      dp=none (uniform sampling of exactly 100 users per round)
  DP-FedAvg z, C             dp=central dp.noise_multiplier=z dp.clip_norm=C (McMahan et al., ICLR 2018)
  adaptive z                 dp=adaptive dp.noise_multiplier=z, started from conf/dp/adaptive.yaml's clip norm,
                             target quantile 0.5, count noise m/20 (Andrew et al., NeurIPS 2021)
The clip norm C0 is not hand-picked: it is the median client update norm (`update_norm` of every client row in
metrics.jsonl, all rounds and seeds) of the non-private runs, which run first, rounded to two significant figures.
The z = 1 runs are repeated at C0/4 and 4·C0, the fixed clip norms adaptive clipping is compared with.

Accuracy at a common ε budget is read off each run's per-round (ε, accuracy) curve: the accuracy after the last
round whose ε is within the budget, which is where a run with dp.epsilon_max = budget stops. One such run
(z = 1, seed 0, the middle budget) checks that: its stop_reason and accuracy must match the curve.
A probe run (one seed, no DP) on the *natural* split of 1,000 Synthetic devices shows why the users are IID here.

Usage: python experiments/dp_fedavg/run.py [--rounds 120] [--seeds 0 1 2] [--zs 0.5 1 2 4 8] [--adaptive-z 1]
                                           [--clip-factors 0.25 4] [--budgets 1 3 15] [--probe-rounds 40]
Runs go to a temporary directory (removed at the end); writes results.json and prints the README's table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from fedsim.run import compose, run_config

NUM_USERS, PER_ROUND, DELTA = 2000, 100, 1e-6
SETTING = [
    "data=synthetic",
    "data.num_devices=100",
    "partition=iid",
    f"partition.num_clients={NUM_USERS}",
    "model=logreg",
    "client.epochs=1",
    "client.batch_size=10",
    "client.optimizer.lr=0.05",
    f"clients_per_round={PER_ROUND}",
    "strategy=fedavg",
    "executor=serial",
    "logger=quiet",
]
PROBE = [
    "data=synthetic",
    "data.num_devices=1000",
    "+data.max_size=300",
    "partition=natural",
    "model=logreg",
    "client.epochs=1",
    "client.batch_size=10",
    "client.optimizer.lr=0.05",
    f"clients_per_round={PER_ROUND}",
    "strategy=fedavg",
    "executor=serial",
    "logger=quiet",
]


def fixed(z: float, clip: float) -> list[str]:
    return ["dp=central", f"dp.noise_multiplier={z:g}", f"dp.clip_norm={clip:g}", f"dp.delta={DELTA:g}"]


def adaptive(z: float) -> list[str]:
    return ["dp=adaptive", f"dp.noise_multiplier={z:g}", f"dp.delta={DELTA:g}", "dp.count_noise=null"]


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def curve(history: list[dict]) -> list[dict]:
    """Per round: ε (0 without DP), test accuracy, and the clip norm and cohort under DP."""
    out = []
    for r in history:
        point = {"round": r["round"], "epsilon": r.get("dp/epsilon", 0.0), "accuracy": r["eval/accuracy"]}
        if "dp/clip_norm" in r:
            point |= {"clip_norm": r["dp/clip_norm"], "cohort": r["dp/cohort"]}
        out.append(point)
    return out


def at_budget(points: list[dict], budget: float) -> dict | None:
    """The last round within ε ≤ budget (None: not even the first round fits)."""
    within = [p for p in points if p["epsilon"] <= budget]
    return within[-1] if within else None


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarise(curves: list[list[dict]], budgets: list[float], dp: bool) -> dict:
    finals = [c[-1]["accuracy"] for c in curves]
    out = {"final_accuracy": finals, "rounds_run": [c[-1]["round"] for c in curves]}
    out["final_accuracy_mean"], out["final_accuracy_std"] = mean_std(finals)
    out["final_epsilon"] = [c[-1]["epsilon"] for c in curves] if dp else None
    if dp:
        out["at_budget"] = {}
        for b in budgets:
            hits = [at_budget(c, b) for c in curves]
            entry = {
                "rounds": [h["round"] if h else 0 for h in hits],
                "accuracy": [h["accuracy"] if h else None for h in hits],
            }
            if all(hits):
                entry["accuracy_mean"], entry["accuracy_std"] = mean_std(entry["accuracy"])
            out["at_budget"][str(b)] = entry
        clips = [c[-1]["clip_norm"] for c in curves]
        out["final_clip_norm"] = clips
        out["clip_norm_last10_mean"] = statistics.mean(p["clip_norm"] for c in curves for p in c[-10:])
        out["mean_cohort"] = statistics.mean(p["cohort"] for c in curves for p in c)
    out["curves"] = [
        [[p["round"], p["epsilon"], p["accuracy"]] + ([p["clip_norm"]] if dp else []) for p in c] for c in curves
    ]
    return out


def table(results: dict) -> str:
    budgets = results["budgets"]
    heads = " | ".join(f"acc. at ε ≤ {b:g} (rounds)" for b in budgets)
    lines = [
        f"| configuration | noise std on the mean update, z·C/m | final ε (δ = {DELTA:g}) | "
        f"final accuracy (mean ± std) | {heads} |",
        "|---" * (4 + len(budgets)) + "|",
    ]
    for name, r in results["configs"].items():
        eps = "–" if r["final_epsilon"] is None else f"{statistics.mean(r['final_epsilon']):.2f}"
        noise = "0" if r["noise_std"] is None else f"{r['noise_std']:.2g}"
        cells = []
        for b in budgets:
            entry = r.get("at_budget", {}).get(str(b))
            if entry is None:
                cells.append("– (ε = ∞)")
            elif "accuracy_mean" in entry:
                rounds = ", ".join(map(str, entry["rounds"]))
                cells.append(f"{entry['accuracy_mean']:.4f} ± {entry['accuracy_std']:.4f} ({rounds})")
            else:
                cells.append("– (one round exceeds it)")
        lines.append(
            f"| {name} | {noise} | {eps} | {r['final_accuracy_mean']:.4f} ± {r['final_accuracy_std']:.4f} | "
            f"{' | '.join(cells)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=120)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--zs", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--adaptive-z", type=float, default=1.0)
    parser.add_argument("--clip-factors", type=float, nargs="+", default=[0.25, 4.0])
    parser.add_argument("--budgets", type=float, nargs="+", default=[1.0, 3.0, 15.0])
    parser.add_argument("--probe-rounds", type=int, default=40)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    start = time.perf_counter()
    curves: dict[str, list[list[dict]]] = {}
    settings: dict[str, list[str]] = {}
    run_s: list[float] = []

    def run(name: str, overrides: list[str], seed: int, tmp: Path, base: list[str] = SETTING) -> tuple[object, Path]:
        run_dir = tmp / f"{len(run_s)}"
        t = time.perf_counter()
        result = run_config(compose([*base, f"num_rounds={args.rounds}", *overrides, f"seed={seed}"]), run_dir=run_dir)
        run_s.append(time.perf_counter() - t)
        points = curve(result.history)
        curves.setdefault(name, []).append(points)
        settings[name] = overrides
        print(
            f"seed {seed}  {name:28s} acc {points[-1]['accuracy']:.4f}  ε {points[-1]['epsilon']:.3f}  "
            f"{run_s[-1]:.1f} s",
            flush=True,
        )
        return result, run_dir

    with tempfile.TemporaryDirectory(prefix="fedsim-dp-") as tmp_name:
        tmp = Path(tmp_name)
        # 1. no DP; the clients' update norms give the clip norm
        norms, norm_by_round = [], {}
        for seed in args.seeds:
            result, run_dir = run("no DP", [], seed, tmp)
            for record in read_rows(run_dir):
                round_norms = [c["update_norm"] for c in record.get("clients", []) if c.get("update_norm") is not None]
                norms += round_norms
                norm_by_round.setdefault(record["round"], []).extend(round_norms)
        num_params = int(result.params.numel())
        median = statistics.median(norms)
        clip = float(f"{median:.2g}")
        print(f"median client update norm {median:.4f} -> clip norm C0 = {clip:g}", flush=True)
        # 2. fixed clipping at each z, C0; z = adaptive_z at other clip norms; adaptive clipping
        names = {}
        for seed in args.seeds:
            for z in args.zs:
                names[(z, 1.0)] = f"DP-FedAvg z={z:g}, C={clip:g}"
                run(names[(z, 1.0)], fixed(z, clip), seed, tmp)
            for f in args.clip_factors:
                names[(args.adaptive_z, f)] = f"DP-FedAvg z={args.adaptive_z:g}, C={clip * f:.2g}"
                run(names[(args.adaptive_z, f)], fixed(args.adaptive_z, float(f"{clip * f:.2g}")), seed, tmp)
            run(f"adaptive z={args.adaptive_z:g}", adaptive(args.adaptive_z), seed, tmp)
        # 3. one run stopped by dp.epsilon_max: it must end where the curve says
        budget = args.budgets[len(args.budgets) // 2]
        z_check = 1.0 if 1.0 in args.zs else args.zs[0]
        name = names[(z_check, 1.0)]
        expected = at_budget(curves[name][0], budget)
        t = time.perf_counter()
        stopped = run_config(
            compose(
                [
                    *SETTING,
                    f"num_rounds={args.rounds}",
                    *fixed(z_check, clip),
                    f"dp.epsilon_max={budget:g}",
                    f"seed={args.seeds[0]}",
                ]
            ),
            run_dir=None,
        )
        run_s.append(time.perf_counter() - t)
        last = stopped.history[-1]
        check = {
            "config": name,
            "seed": args.seeds[0],
            "epsilon_max": budget,
            "stop_reason": stopped.stop_reason,
            "rounds": last["round"],
            "epsilon": last["dp/epsilon"],
            "accuracy": last["eval/accuracy"],
            "curve_rounds": expected["round"] if expected else 0,
            "curve_accuracy": expected["accuracy"] if expected else None,
        }
        check["matches_curve"] = bool(
            expected
            and check["rounds"] == expected["round"]
            and check["accuracy"] == expected["accuracy"]
            and "privacy budget" in check["stop_reason"]
        )
        print(
            f"dp.epsilon_max={budget:g}: stopped after round {check['rounds']} (curve: {check['curve_rounds']}), "
            f"matches: {check['matches_curve']}; {check['stop_reason']}",
            flush=True,
        )
        # 4. the natural split of 1,000 devices, without DP
        probe = None
        if args.probe_rounds > 0:
            t = time.perf_counter()
            result = run_config(
                compose([*PROBE, f"num_rounds={args.probe_rounds}", f"seed={args.seeds[0]}"]), run_dir=None
            )
            run_s.append(time.perf_counter() - t)
            iid = curves["no DP"][0]
            probe = {
                "setting": PROBE,
                "rounds": args.probe_rounds,
                "seed": args.seeds[0],
                "accuracy": result.history[-1]["eval/accuracy"],
                "iid_accuracy_same_round": iid[min(args.probe_rounds, len(iid)) - 1]["accuracy"],
            }
            print(
                f"natural split of 1,000 devices, no DP, {args.probe_rounds} rounds: acc {probe['accuracy']:.4f} "
                f"(IID users, same round: {probe['iid_accuracy_same_round']:.4f})",
                flush=True,
            )

    clip_of = {name: None for name in curves}
    for (_z, f), name in names.items():
        clip_of[name] = float(f"{clip * f:.2g}")
    configs = {}
    for name, c in curves.items():
        dp = name != "no DP"
        entry = {"overrides": settings[name]} | summarise(c, args.budgets, dp)
        z = None if not dp else float(settings[name][1].split("=")[1])
        # noise std per coordinate on the mean update; adaptive: z_Δ at the last clip norm (mean over seeds)
        if name.startswith("adaptive"):
            z_delta = (z**-2 - (2 * PER_ROUND / 20) ** -2) ** -0.5
            entry["noise_std"] = z_delta * statistics.mean(entry["final_clip_norm"]) / PER_ROUND
            entry["z_update"] = z_delta
        else:
            entry["noise_std"] = None if not dp else z * clip_of[name] / PER_ROUND
        configs[name] = entry
    results = {
        "command": "python experiments/dp_fedavg/run.py "
        + " ".join(
            [
                f"--rounds {args.rounds}",
                "--seeds " + " ".join(map(str, args.seeds)),
                "--zs " + " ".join(f"{z:g}" for z in args.zs),
                f"--adaptive-z {args.adaptive_z:g}",
                "--clip-factors " + " ".join(f"{f:g}" for f in args.clip_factors),
                "--budgets " + " ".join(f"{b:g}" for b in args.budgets),
                f"--probe-rounds {args.probe_rounds}",
            ]
        ),
        "setting": SETTING,
        "rounds": args.rounds,
        "seeds": args.seeds,
        "num_users": NUM_USERS,
        "clients_per_round": PER_ROUND,
        "q": PER_ROUND / NUM_USERS,
        "delta": DELTA,
        "num_params": num_params,
        "clip_norm": clip,
        "median_update_norm": median,
        "update_norm_quantiles": {
            str(p): statistics.quantiles(norms, n=20)[int(p * 20) - 1] for p in (0.1, 0.25, 0.5, 0.75, 0.9)
        },
        "median_update_norm_by_round": {str(r): statistics.median(v) for r, v in sorted(norm_by_round.items()) if v},
        "budgets": args.budgets,
        "budget_check": check,
        "natural_split_probe": probe,
        "curves_format": "per config, per seed: [round, epsilon, accuracy] (+ clip_norm under DP) for every round",
        "configs": configs,
        "run_s": run_s,
        "wall_s": time.perf_counter() - start,
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    print(f"total {results['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
