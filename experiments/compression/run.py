"""Update compression: accuracy against megabytes communicated, over 3 seeds (issue #19).

Setting: Synthetic(1, 1) with its 30 natural devices (one client each, power-law sizes, non-IID labels), the 2NN MLP
(two hidden layers of 200: 54,410 weights), FedAvg, 10 clients per round, E = 1 local epoch, batch 10, SGD lr 0.05,
--rounds rounds. Only the uplink (each client's update, trained − received weights) is compressed; the global model
goes down as float32 in every configuration. Configurations:
  float32            compression=none
  fp16               compression=fp16
  QSGD 8-bit         compression=qsgd (bucket 512)
  QSGD 4-bit         compression=qsgd with bits 4 (bucket 512)         extra: the paper's other low-loss setting
  QSGD 2-bit         compression=qsgd with bits 2 (bucket 512)
  top-1 % + EF       compression=topk (1 %, int32 positions, error feedback)
  top-1 %, no EF     compression=topk compression.error_feedback=false extra: what the error feedback buys
Byte counts are those of fedsim's fixed-width encodings (no entropy coding; fedsim/comm/codecs.py).
Usage: python experiments/compression/run.py [--rounds 150] [--seeds 0 1 2] [--target 0.8]
Runs keep their history in memory (run_dir=None); writes results.json, accuracy_vs_mb.png (if matplotlib is
installed) and prints the README's table.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

import torch
from hydra.utils import instantiate

from fedsim.params import flatten
from fedsim.run import build_compression, compose, run_config
from fedsim.server.setup import initial_model

SETTING = [
    "data=synthetic",
    "partition=auto",
    "model=mlp",
    "strategy=fedavg",
    "clients_per_round=10",
    "client.epochs=1",
    "client.batch_size=10",
    "client.optimizer.lr=0.05",
    "executor=serial",
    "logger=quiet",
]

CONFIGS: dict[str, list[str]] = {
    "float32 (no compression)": ["compression=none"],
    "fp16": ["compression=fp16"],
    "QSGD 8-bit": ["compression=qsgd"],
    "QSGD 4-bit": ["compression=qsgd", "compression.uplink=[{name: qsgd, bits: 4, bucket_size: 512}]"],
    "QSGD 2-bit": ["compression=qsgd", "compression.uplink=[{name: qsgd, bits: 2, bucket_size: 512}]"],
    "top-1 % + error feedback": ["compression=topk"],
    "top-1 %, no error feedback": ["compression=topk", "compression.error_feedback=false"],
}
REQUIRED = ["float32 (no compression)", "fp16", "QSGD 8-bit", "QSGD 2-bit", "top-1 % + error feedback"]


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def first_reach(history: list[dict], target: float) -> dict | None:
    """The first round whose centralized test accuracy is ≥ ``target`` (None: never within the run)."""
    return next((r for r in history if r.get("eval/accuracy", -1.0) >= target), None)


def per_run(history: list[dict], num_params: int, target: float) -> dict:
    last = history[-1]
    uploads = sum(r["client/num_sampled"] - r["client/num_failed"] for r in history)
    hit = first_reach(history, target)
    accs = [r["eval/accuracy"] for r in history if "eval/accuracy" in r]
    return {
        "final_accuracy": last["eval/accuracy"],
        "best_accuracy": max(accs),
        "mean_accuracy_last10": statistics.mean(accs[-10:]),
        "mb_up": last["comm/bytes_up_total"] / 1e6,
        "mb_down": last["comm/bytes_down_total"] / 1e6,
        "mb_total": last["comm/mb_total"],
        "bytes_per_update": last["comm/bytes_up_total"] / uploads,
        "uplink_ratio": 4 * num_params * uploads / last["comm/bytes_up_total"],
        "rounds_to_target": None if hit is None else hit["round"],
        "mb_to_target": None if hit is None else hit["comm/mb_total"],
        "mb_up_to_target": None if hit is None else hit["comm/bytes_up_total"] / 1e6,
        "curve": [[r["comm/mb_total"], r["eval/accuracy"]] for r in history if "eval/accuracy" in r],
        "curve_mb_up": [r["comm/bytes_up_total"] / 1e6 for r in history if "eval/accuracy" in r],
        "rounds": [r["round"] for r in history if "eval/accuracy" in r],
    }


def summarise(runs: list[dict]) -> dict:
    out = {"seeds": len(runs)}
    for key in (
        "final_accuracy",
        "mean_accuracy_last10",
        "best_accuracy",
        "mb_up",
        "mb_down",
        "mb_total",
        "uplink_ratio",
        "bytes_per_update",
    ):
        out[key + "_mean"], out[key + "_std"] = mean_std([r[key] for r in runs])
    for key in ("rounds_to_target", "mb_to_target", "mb_up_to_target"):
        reached = [r[key] for r in runs if r[key] is not None]
        out[key + "_per_seed"] = [r[key] for r in runs]
        out[key + "_reached"] = len(reached)
        out[key + "_mean"], out[key + "_std"] = mean_std(reached) if reached else (None, None)
    return out


def codec_errors(cfg, chains: dict, num_params: int, draws: int = 5) -> dict:
    """How much each uplink encoding distorts one real client update: Δ of one client (seed 0, round 1, the run's
    setting with one client per round, so the global step is that client's update), encoded ``draws`` times with
    different generators. Relative L2 error ‖C(Δ) − Δ‖ / ‖Δ‖ and cosine(C(Δ), Δ), means over the draws."""
    result = run_config(cfg, run_dir=None)
    factory = functools.partial(
        instantiate(cfg.model), input_shape=(cfg.data.num_features,), num_classes=cfg.data.num_classes
    )
    start = flatten(initial_model(factory, int(cfg.seed)))
    assert start.numel() == num_params
    delta = result.params - start
    out = {"update_norm": float(delta.norm())}
    for name, chain in chains.items():
        errs, coss = [], []
        for draw in range(draws):
            decoded = chain.apply(delta, torch.Generator().manual_seed(draw))
            errs.append(float((decoded - delta).norm() / delta.norm()))
            coss.append(float(torch.nn.functional.cosine_similarity(decoded, delta, dim=0)))
        out[name] = {"relative_l2_error": statistics.mean(errs), "cosine": statistics.mean(coss)}
    return out


def fmt(mean: float | None, std: float | None, digits: int) -> str:
    return "–" if mean is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def table(results: dict) -> str:
    target = results["target_accuracy"]
    lines = [
        f"| configuration | final accuracy | accuracy, mean of last 10 rounds | MB up | MB down | MB total | "
        f"uplink ratio | MB to reach {target} (seeds reaching) | of which up | rounds to reach {target} (per seed) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results["configs"].items():
        n = r["seeds"]
        lines.append(
            f"| {name} | {fmt(r['final_accuracy_mean'], r['final_accuracy_std'], 4)} | "
            f"{fmt(r['mean_accuracy_last10_mean'], r['mean_accuracy_last10_std'], 4)} | {r['mb_up_mean']:.1f} | "
            f"{r['mb_down_mean']:.1f} | {r['mb_total_mean']:.1f} | {r['uplink_ratio_mean']:.1f}× | "
            f"{fmt(r['mb_to_target_mean'], r['mb_to_target_std'], 1)} ({r['mb_to_target_reached']}/{n}) | "
            f"{fmt(r['mb_up_to_target_mean'], r['mb_up_to_target_std'], 2)} | "
            f"{fmt(r['rounds_to_target_mean'], r['rounds_to_target_std'], 1)} "
            f"({', '.join('–' if x is None else str(x) for x in r['rounds_to_target_per_seed'])}) |"
        )
    return "\n".join(lines)


def plot(results: dict, path: Path) -> bool:
    """accuracy_vs_mb.png: mean over seeds of the test accuracy against MB communicated (both ways; uplink only, log
    scale) and against rounds, with the seeds' min-max band; False if matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(18, 5))
    for name, runs in results["runs"].items():
        curves = [run["curve"] for run in runs.values()]
        length = min(len(c) for c in curves)
        mb = [curves[0][i][0] for i in range(length)]  # the same for every seed: fixed sizes, no failures
        mb_up = list(runs.values())[0]["curve_mb_up"][:length]
        rounds = list(runs.values())[0]["rounds"][:length]
        accs = [[c[i][1] for c in curves] for i in range(length)]
        mean = [statistics.mean(a) for a in accs]
        lo, hi = [min(a) for a in accs], [max(a) for a in accs]
        style = "--" if name not in REQUIRED else "-"
        for ax, x in ((axes[0], mb), (axes[1], mb_up), (axes[2], rounds)):
            (line,) = ax.plot(x, mean, style, label=name, lw=1.3)
            ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.08, lw=0)
    for ax in axes:
        ax.axhline(results["target_accuracy"], color="grey", lw=0.8, ls=":")
        ax.set_ylabel("centralized test accuracy")
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("MB communicated, up + down (cumulative; the float32 downlink is the same for all)")
    axes[1].set_xscale("log")
    axes[1].set_xlabel("MB uploaded (cumulative, log scale)")
    axes[2].set_xlabel("round")
    axes[2].legend(fontsize=8, loc="lower right")
    fig.suptitle(
        f"FedAvg, Synthetic(1,1), 2NN MLP ({results['num_params']:,} weights): mean of "
        f"{len(results['seeds'])} seeds, band = min-max"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    start = time.perf_counter()
    # every config composed before the first run, so the whole experiment reads one state of conf/
    composed = {
        (seed, name): compose([*SETTING, *overrides, f"num_rounds={args.rounds}", f"seed={seed}"])
        for seed in args.seeds
        for name, overrides in CONFIGS.items()
    }
    one_update = compose([*SETTING, "num_rounds=1", "clients_per_round=1", "seed=0"])
    chains = {name: build_compression(composed[(args.seeds[0], name)]).uplink for name in CONFIGS}
    runs: dict[str, dict[str, dict]] = {}
    num_params = 0
    for seed in args.seeds:
        for name in CONFIGS:
            t0 = time.perf_counter()
            result = run_config(composed[(seed, name)], run_dir=None)
            num_params = result.params.numel()
            run = per_run(result.history, num_params, args.target)
            run["wall_s"] = time.perf_counter() - t0
            runs.setdefault(name, {})[str(seed)] = run
            print(
                f"seed {seed}  {name:28s} final acc {run['final_accuracy']:.4f}  MB {run['mb_total']:8.1f}  "
                f"to {args.target}: round {run['rounds_to_target']}  ({run['wall_s']:.0f} s)",
                flush=True,
            )
    results = {
        "command": "python experiments/compression/run.py "
        + " ".join(
            [f"--rounds {args.rounds}", "--seeds " + " ".join(map(str, args.seeds)), f"--target {args.target:g}"]
        ),
        "setting": SETTING,
        "configs_overrides": CONFIGS,
        "rounds": args.rounds,
        "seeds": args.seeds,
        "target_accuracy": args.target,
        "num_params": num_params,
        "float32_model_bytes": 4 * num_params,
        "encoding": "fixed width, no entropy coding: float32 4 B, fp16 2 B, QSGD b bits per value + one float32 norm "
        "per bucket, top-k int32 positions + float32 values",
        "configs": {name: summarise(list(r.values())) for name, r in runs.items()},
        "codec_error_on_one_update": codec_errors(one_update, chains, num_params),
        "runs": runs,
        "torch": torch.__version__,
    }
    made = plot(results, args.out / "accuracy_vs_mb.png")
    results["plot"] = "accuracy_vs_mb.png" if made else None
    results["wall_s"] = time.perf_counter() - start
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))
    print("\ncodec distortion of one client update (relative L2 error, cosine):")
    for name in CONFIGS:
        e = results["codec_error_on_one_update"][name]
        print(f"  {name:28s} {e['relative_l2_error']:.3f}  {e['cosine']:.3f}")
    print(
        f"plot: {'accuracy_vs_mb.png' if made else 'skipped (matplotlib not installed)'}; "
        f"total {results['wall_s']:.0f} s"
    )


if __name__ == "__main__":
    main()
