"""Secure aggregation: test accuracy against the bits b per coordinate on the default synthetic task.

Setting: fedsim's default run (Synthetic(1, 1), its 30 natural devices, 10 clients a round, 30 rounds, multinomial
logistic regression of 610 weights, FedAvg), with secagg=secagg at b in {8, 12, 16, 20, 24, 32}: each update clipped
to L2 norm 1 (it never binds on this task: secagg/clipped is 0 in every round), rotated (d' = 1024), scaled by the
default scale (the largest with which the sum of 10 clients cannot wrap around), stochastically rounded, masked and
summed; the strategy sees the uniform mean of the decoded updates. Baselines: plain FedAvg (secagg=none, weighted by
examples); b = 32, whose decoding error is below 2e-7, stands for the unquantized uniform mean. Wrap-around: b = 8
with scales above the default (12), up to where the sum wraps. A larger cohort: every device each round (30), which
leaves b = 8 a default scale of 4.

Usage: python experiments/secagg/bits.py [--seeds 0 1 2] [--bits 8 12 16 20 24 32]
Writes bits.json next to this file and prints the README's table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from fedsim.run import compose, run_config

HERE = Path(__file__).resolve().parent


def one_run(overrides: list[str]) -> dict[str, Any]:
    """A run's final accuracy and its secagg/ diagnostics (means over the rounds)."""
    history = run_config(compose([*overrides, "logger=quiet"])).history
    out: dict[str, Any] = {"accuracy": history[-1]["eval/accuracy"]}
    for key in ("error_max", "error_bound", "wrapped", "clipped", "scale"):
        values = [r[f"secagg/{key}"] for r in history if f"secagg/{key}" in r]
        if values:
            out[key] = statistics.fmean(values)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--bits", type=int, nargs="+", default=[8, 12, 16, 20, 24, 32])
    args = parser.parse_args()
    configs = {"FedAvg (no secure aggregation)": ["secagg=none"]}
    configs |= {f"SecAgg, b = {b}": ["secagg=secagg", f"secagg.bits={b}"] for b in args.bits}
    for scale in (500, 2000, 8000):  # the default at b = 8 is 12: larger scales trade wrap-around for resolution
        configs[f"SecAgg, b = 8, scale {scale}"] = ["secagg=secagg", "secagg.bits=8", f"secagg.scale={scale}"]
    for b in (8, 12, 32):  # every device each round: a cohort of 30 leaves b = 8 a default scale of 4
        configs[f"SecAgg, b = {b}, 30 clients a round"] = ["secagg=secagg", f"secagg.bits={b}", "clients_per_round=30"]
    configs["FedAvg (no secure aggregation), 30 clients a round"] = ["secagg=none", "clients_per_round=30"]
    start, results = time.perf_counter(), {}
    for name, overrides in configs.items():
        results[name] = {seed: one_run([*overrides, f"seed={seed}"]) for seed in args.seeds}
        print(f"{name}: {[round(r['accuracy'], 4) for r in results[name].values()]}", flush=True)
    (HERE / "bits.json").write_text(json.dumps({"seeds": args.seeds, "results": results}, indent=1))
    print(f"\n{time.perf_counter() - start:.0f} s\n")
    header = (
        "| configuration | final accuracy (mean ± sd) | error of a coordinate: max seen / bound | wrapped a round |"
    )
    print(header)
    print("|---|---|---|---|")
    for name, runs in results.items():
        accuracy = [r["accuracy"] for r in runs.values()]
        sd = statistics.stdev(accuracy) if len(accuracy) > 1 else 0.0
        first = next(iter(runs.values()))
        error = f"{first['error_max']:.2e} / {first['error_bound']:.2e}" if "error_max" in first else "-"
        wrapped = f"{statistics.fmean(r['wrapped'] for r in runs.values()):.1f}" if "wrapped" in first else "-"
        print(f"| {name} | {statistics.fmean(accuracy):.4f} ± {sd:.4f} | {error} | {wrapped} |")


if __name__ == "__main__":
    main()
