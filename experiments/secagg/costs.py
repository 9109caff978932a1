"""Secure aggregation's bytes and simulated time against the cohort size, SecAgg against SecAgg+, from fedsim's cost
and time models (fedsim/secagg/costs.py, timing.py: the formulas of docs/secure-aggregation.md) without training:
every client has k neighbours (k = n - 1 for SecAgg, SecAgg+'s default k, the smallest even number >= 3·log2 n).
Bytes: every client survives. Time: the protocol's phases alone (no download or training), every client at the
sampled clock's median bandwidths (2 Mbit/s up, 20 Mbit/s down), with no client and a tenth of the clients
dropping out after the key phases (threshold 0.5).

Two models: the default task's logistic regression (610 weights, d' = 1024 after the rotation's padding) and a
model of 1,663,370 weights (McMahan et al.'s CNN for MNIST, `model=cnn`; d' = 2^21), b = 16 bits a coordinate.
One protocol round per cohort size is also run for real (random inputs, the masks, shares and recovery of
fedsim/secagg/protocol.py) up to the sizes where the simulation stays quick, and its output checked against the
plain modular sum.

Usage: python experiments/secagg/costs.py [--cohorts 100 300 1000 3000 10000] [--bits 16] [--simulate-up-to 300]
                                         [--dropped 0 0.1]
Writes costs.json next to this file and prints the README's tables.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from fedsim.secagg.costs import cohort_bytes
from fedsim.secagg.masking import complete_graph, default_degree, harary_graph
from fedsim.secagg.protocol import RoundSetup, plain_sum, secure_sum
from fedsim.secagg.quantize import padded_size
from fedsim.secagg.timing import round_seconds, uniform_round
from fedsim.sim.profiles import BYTES_PER_S_PER_MBPS

HERE = Path(__file__).resolve().parent
MODELS = {"logreg (610 weights)": 610, "CNN (1,663,370 weights)": 1_663_370}
UP, DOWN = 2.0 * BYTES_PER_S_PER_MBPS, 20.0 * BYTES_PER_S_PER_MBPS  # clock=sampled's median bandwidths


def fmt_s(x: float) -> str:
    """A duration for the tables: three significant digits below 100 s, whole seconds above."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def timed(n: int, k: int, coordinates: int, bits: int, dropped: float) -> dict[str, float]:
    """The protocol's seconds by phase (and the round's) for a cohort of ``n`` with ``dropped`` of them dropping."""
    phases = uniform_round(n, k, round(dropped * n), coordinates, bits, 0.5, UP, DOWN)
    return phases | {"round": round_seconds(phases)}


def simulate(n: int, k: int, coordinates: int, bits: int, dropout: float) -> tuple[float, bool]:
    """Seconds of one simulated protocol round with ``dropout`` of the clients dropped, and whether its output is
    the plain modular sum."""
    rng = np.random.default_rng(n)
    clients = list(range(n))
    graph = complete_graph(clients) if k == n - 1 else harary_graph(clients, k, seed=0, round_num=1)
    inputs = {c: rng.integers(0, 2**bits, coordinates, dtype=np.int64) for c in clients if rng.random() >= dropout}
    start = time.perf_counter()
    total = secure_sum(RoundSetup(0, 1, bits, graph, threshold=0.5), inputs)
    return time.perf_counter() - start, bool(np.array_equal(total, plain_sum(inputs, bits)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cohorts", type=int, nargs="+", default=[100, 300, 1000, 3000, 10_000])
    parser.add_argument("--bits", type=int, default=16)
    parser.add_argument("--simulate-up-to", type=int, default=300)
    parser.add_argument("--dropped", type=float, nargs="+", default=[0.0, 0.1])
    args = parser.parse_args()
    rows = []
    for model, weights in MODELS.items():
        coordinates = padded_size(weights, True)
        for n in args.cohorts:
            plus_k = default_degree(n)
            secagg, plus = (
                cohort_bytes(n, n - 1, coordinates, args.bits),
                cohort_bytes(n, plus_k, coordinates, args.bits),
            )
            times = {
                str(d): {
                    "secagg": timed(n, n - 1, coordinates, args.bits, d),
                    "secagg_plus": timed(n, plus_k, coordinates, args.bits, d),
                }
                for d in args.dropped
            }
            rows.append(
                {"model": model, "n": n, "k_plus": plus_k, "secagg": secagg, "secagg_plus": plus, "seconds": times}
            )
    checks = []
    for n in (c for c in args.cohorts if c <= args.simulate_up_to):
        for name, k in (("SecAgg", n - 1), ("SecAgg+", default_degree(n))):
            seconds, equal = simulate(n, k, 1024, args.bits, dropout=0.1)
            checks.append({"protocol": name, "n": n, "k": k, "seconds": seconds, "equal": equal})
    (HERE / "costs.json").write_text(json.dumps({"bits": args.bits, "rows": rows, "simulated": checks}, indent=1))
    for model in MODELS:
        print(f"\n{model}, b = {args.bits}, d' = {padded_size(MODELS[model], True):,}\n")
        print("| cohort n | SecAgg: per client | SecAgg: server | SecAgg+ k | SecAgg+: per client | SecAgg+: server |")
        print("|---:|---:|---:|---:|---:|---:|")
        for r in (r for r in rows if r["model"] == model):
            (sc, ss), (pc, ps) = r["secagg"], r["secagg_plus"]
            secagg = f"{sc / 1e3:,.1f} kB | {ss / 1e6:,.1f} MB"
            print(f"| {r['n']:,} | {secagg} | {r['k_plus']} | {pc / 1e3:,.1f} kB | {ps / 1e6:,.1f} MB |")
    for model in MODELS:
        print(f"\n{model}: simulated seconds of the protocol's round (server compute in brackets)\n")
        heads = " | ".join(f"SecAgg, {d:.0%} drop | SecAgg+, {d:.0%} drop" for d in args.dropped)
        print(f"| cohort n | {heads} |")
        print("|---:|" + "---:|" * 2 * len(args.dropped))
        for r in (r for r in rows if r["model"] == model):
            cells = [
                f"{fmt_s(r['seconds'][str(d)][p]['round'])} ({fmt_s(r['seconds'][str(d)][p]['server'])})"
                for d in args.dropped
                for p in ("secagg", "secagg_plus")
            ]
            print(f"| {r['n']:,} | " + " | ".join(cells) + " |")
    print("\n| protocol | n | k | one simulated round (s) | equals the plain sum |")
    print("|---|---:|---:|---:|---|")
    for c in checks:
        print(f"| {c['protocol']} | {c['n']} | {c['k']} | {c['seconds']:.2f} | {c['equal']} |")


if __name__ == "__main__":
    main()
