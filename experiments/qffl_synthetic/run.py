"""q-FFL (q-FedAvg) vs its q=0 baseline on Synthetic(1,1) with 100 devices (Li et al., ICLR 2020, Table 1 setting).

Runs every (q, seed) through fedsim's own config path, scores every device on its own local test split every
--eval-every rounds and after the last round (evaluate_clients=all), and writes results.json: per run the final
device-accuracy distribution and its curve over the evaluations, per configuration the mean ± std over seeds.
The main setting is the paper's L = 1/lr (strategy.lipschitz=null). --deviation-lipschitz adds q=1 runs with that
fixed L instead (a deviation from the paper: larger q=1 steps); --deviation-lipschitz none leaves them out.
results.json is rewritten after every finished run, so a cut-short run keeps what finished.
Usage: python experiments/qffl_synthetic/run.py [--rounds 1750] [--eval-every 250] [--qs 0 1] [--seeds 0 1 2]
                                                [--deviation-lipschitz 1] [--jobs 2] [--plot-only]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

from fedsim.run import compose, run_config

SETTING = [
    "data=synthetic",
    "data.alpha=1",
    "data.beta=1",
    "data.num_devices=100",
    "+data.max_size=500",
    "data.test_fraction=0.1",
    "client_test_fraction=0.111",  # per device: ~80 % local train, ~10 % local test
    "model=logreg",
    "clients_per_round=10",
    "client.epochs=1",
    "client.batch_size=10",
    "client.optimizer.lr=0.1",
    "strategy=qffl",
    "strategy.sampling=weighted",
    "evaluate_clients=all",
    "executor=serial",
    "logger=quiet",  # no TensorBoard, no progress bar; no run directory, so no checkpoint and no files at all
]
STATS = {  # what the table reports, from an every-device evaluation
    "average": "eval_global/accuracy_mean",
    "worst10": "eval_global/accuracy_worst10",
    "best10": "eval_global/accuracy_best10",
    "std": "eval_global/accuracy_std",
}


def distribution(row: dict) -> dict[str, float]:
    """The device-accuracy distribution of one evaluation, in % (variance in %², as the paper reports it)."""
    d = {name: 100 * row[key] for name, key in STATS.items()}
    d["variance"] = d.pop("std") ** 2
    return d


def label(q: float, lipschitz: float | None) -> str:
    return f"q={q:g}" if lipschitz is None else f"q={q:g}, L={lipschitz:g} (deviation)"


def one_run(q: float, lipschitz: float | None, seed: int, rounds: int, eval_every: int) -> dict:
    """One configuration: the final device-accuracy distribution and its curve over the evaluations."""
    overrides = SETTING + [
        f"strategy.q={q}",
        f"strategy.lipschitz={'null' if lipschitz is None else lipschitz}",
        f"seed={seed}",
        f"num_rounds={rounds}",
        f"eval_every={eval_every}",
    ]
    start = time.perf_counter()
    history = run_config(compose(overrides)).history
    curve = [
        {"round": r["round"], **distribution(r), "central_test_accuracy": 100 * r["eval/accuracy"]}
        for r in history
        if STATS["average"] in r
    ]
    return {
        "config": label(q, lipschitz),
        "q": q,
        "lipschitz": lipschitz,
        "seed": seed,
        "rounds": rounds,
        "final": distribution(history[-1]),
        "central_test_accuracy": 100 * history[-1]["eval/accuracy"],
        "curve": curve,
        "wall_s": time.perf_counter() - start,
    }


def summarise(runs: list[dict]) -> dict[str, dict]:
    """Per configuration: each statistic's [mean, std] over seeds (population std), finally and per evaluation."""
    table: dict[str, dict] = {}
    for name in dict.fromkeys(r["config"] for r in runs):
        chosen = sorted((r for r in runs if r["config"] == name), key=lambda r: r["seed"])

        def stats(rows: list[dict]) -> dict[str, list[float]]:
            return {
                k: [statistics.fmean(x[k] for x in rows), statistics.pstdev(x[k] for x in rows)]
                for k in ("average", "worst10", "best10", "variance")
            }

        rounds = [p["round"] for p in chosen[0]["curve"]]
        table[name] = {
            "seeds": [r["seed"] for r in chosen],
            "final": stats([r["final"] for r in chosen]),
            "curve": [
                {"round": t, **stats([r["curve"][i] for r in chosen])}
                for i, t in enumerate(rounds)
                if all(len(r["curve"]) > i and r["curve"][i]["round"] == t for r in chosen)
            ],
        }
    return table


def plot(result: dict, path: Path) -> None:
    """curves.png: mean ± std over seeds of the average, worst 10 % and variance per evaluation (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = {
        "average": "average device accuracy (%)",
        "worst10": "worst 10 % of devices (%)",
        "variance": "variance of device accuracy (%²)",
    }
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4))
    for name, entry in result["table"].items():
        rounds = [p["round"] for p in entry["curve"]]
        for ax, key in zip(axes, keys, strict=True):
            mean = [p[key][0] for p in entry["curve"]]
            std = [p[key][1] for p in entry["curve"]]
            (line,) = ax.plot(rounds, mean, marker="o", ms=3, label=name, ls="--" if "deviation" in name else "-")
            ax.fill_between(
                rounds,
                [m - s for m, s in zip(mean, std, strict=True)],
                [m + s for m, s in zip(mean, std, strict=True)],
                color=line.get_color(),
                alpha=0.15,
            )
    for ax, title in zip(axes, keys.values(), strict=True):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("round")
    axes[0].legend(fontsize=8)
    fig.suptitle(
        "q-FFL, Synthetic(1,1), 100 devices: mean ± std over seeds "
        f"{result['table'][next(iter(result['table']))]['seeds']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1750)
    parser.add_argument("--eval-every", type=int, default=250, help="every-device evaluation (and the last round)")
    parser.add_argument("--qs", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--deviation-lipschitz", default="1", help="L of the extra q=1 runs; 'none': no such runs")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time, each in its own process (serial executor)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    parser.add_argument("--plot-only", action="store_true", help="only redraw curves.png from results.json")
    args = parser.parse_args()
    if args.plot_only:
        plot(json.loads((args.out / "results.json").read_text()), args.out / "curves.png")
        return
    start = time.perf_counter()
    jobs = [(q, None, seed) for q in args.qs for seed in args.seeds]  # the paper's setting first
    if args.deviation_lipschitz.lower() != "none":
        jobs += [(1.0, float(args.deviation_lipschitz), seed) for seed in args.seeds]
    runs: list[dict] = []
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(one_run, q, lip, seed, args.rounds, args.eval_every) for q, lip, seed in jobs]
        for future in as_completed(futures):
            r = future.result()
            runs.append(r)
            f = r["final"]
            print(
                f"{r['config']} seed={r['seed']}: average {f['average']:.1f}  worst10 {f['worst10']:.1f}  "
                f"best10 {f['best10']:.1f}  variance {f['variance']:.0f}  ({r['wall_s']:.0f} s, "
                f"{time.perf_counter() - start:.0f} s since start)",
                flush=True,
            )
            order = {job: i for i, job in enumerate(jobs)}
            runs.sort(key=lambda r: order[(r["q"], r["lipschitz"], r["seed"])])
            result = {
                "setting": SETTING,
                "rounds": args.rounds,
                "eval_every": args.eval_every,
                "table": summarise(runs),
                "runs": runs,
                "wall_s": time.perf_counter() - start,
                "finished_runs": f"{len(runs)} of {len(jobs)}",
            }
            (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    for name, entry in result["table"].items():
        print(name, "  ".join(f"{k} {m:.1f} ± {s:.1f}" for k, (m, s) in entry["final"].items()))
    print(f"wall time {time.perf_counter() - start:.0f} s")
    plot(result, args.out / "curves.png")


if __name__ == "__main__":
    main()
