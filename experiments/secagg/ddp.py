"""Distributed DP under secure aggregation against central DP: the noise each needs for the same ε, and test accuracy
at the same ε.

Part 1, the noise (no training): the noise multiplier z (noise std of the sum over the clip) the distributed discrete
Gaussian (DDG) and Skellam need at b bits for the ε that the central Gaussian mechanism reaches with z_c, both without
amplification by sampling, over T rounds (dp-accounting's RDP accountant over the same orders for the central one,
fedsim's own solver, SecureAggregation.prepare, for the distributed ones), with fedsim's default scale (no
wrap-around possible) and with the papers' scale (secagg.scale_sigmas = 4: four standard deviations of a coordinate
of the sum fit). z_c = 1 is the papers' regime (their runs need z of about 1 once sampling amplifies the privacy),
z_c = 4 an unamplified one. Two models with 100 clients a round: the default task's logistic regression
(d' = 1,024) and McMahan et al.'s CNN for MNIST (about 1.7 million weights, d' = 2^21), the papers' size.

Part 2, accuracy: experiments/dp_fedavg's task (Synthetic(1, 1) from 100 devices dealt IID to 2,000 users, 100 users
a round, logistic regression, E = 1, batch 10, lr 0.05, clip 0.14, δ = 1e-6), T rounds, SecAgg+ with distributed DP
at target ε (secagg.dp.epsilon) and b bits, against central DP (dp=central) run with the noise multiplier that the
same ε needs without amplification (its own log reports a smaller ε: fedsim's central accountant amplifies by its
Poisson sampling, q = 0.05), and SecAgg+ without DP.

Usage: python experiments/secagg/ddp.py [--seeds 0 1] [--rounds 60] [--epsilons 5 20] [--ddg-bits 12 14 16]
                                        [--skellam-bits 12 16] [--sigma-bits 12] [--part 1 2] [--tables]
Writes ddp.json next to this file and prints the README's tables (--tables: prints those of ddp.json, runs nothing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import dp_accounting

from fedsim.run import compose, run_config
from fedsim.secagg import DistributedDP, SecureAggregation
from fedsim.secagg.accounting import ORDERS

HERE = Path(__file__).resolve().parent
NUM_USERS, PER_ROUND, DELTA, CLIP = 2000, 100, 1e-6, 0.14
TASK = [
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
SETTINGS = {  # part 1: (clients a round, weights, rounds, δ)
    "logreg (d' = 1,024), 100 clients, 100 rounds": (100, 610, 100, DELTA),
    "CNN (d' = 2^21), 100 clients, 100 rounds": (100, 1_663_370, 100, DELTA),
}
CENTRAL_ZS, BITS_1 = (1.0, 4.0), (10, 12, 14, 16, 18, 20, 24)


def central_epsilon(z: float, rounds: int, delta: float) -> float:
    """ε of ``rounds`` full-participation rounds of the Gaussian mechanism with noise multiplier ``z``."""
    accountant = dp_accounting.rdp.RdpAccountant(orders=list(ORDERS))
    accountant.compose(dp_accounting.GaussianDpEvent(z), rounds)
    return float(accountant.get_epsilon(delta))


def central_z(epsilon: float, rounds: int, delta: float) -> float:
    """The Gaussian mechanism's noise multiplier for ε after ``rounds`` full-participation rounds (bisection)."""

    def spent(z: float) -> float:
        return central_epsilon(z, rounds, delta)

    low, high = 1e-3, 1e4
    while high - low > 1e-9 * high:
        middle = (low + high) / 2
        low, high = (low, middle) if spent(middle) <= epsilon else (middle, high)
    return high


def distributed_z(
    mechanism: str, epsilon: float, bits: int, setting: tuple[int, int, int, float], k: float | None
) -> float | None:
    """The distributed mechanism's z at b bits (None: the target cannot be reached)."""
    n, weights, rounds, delta = setting
    dp = DistributedDP(mechanism=mechanism, epsilon=epsilon, delta=delta)
    stage = SecureAggregation(bits=bits, clip=1.0, clients_per_round=n, num_rounds=rounds, dp=dp, scale_sigmas=k)
    try:
        stage.prepare(weights)
    except ValueError:
        return None
    return stage.dp.z


def part_one() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, setting in SETTINGS.items():
        for zc in CENTRAL_ZS:
            epsilon = central_epsilon(zc, setting[2], setting[3])
            row: dict[str, Any] = {"central": zc, "epsilon": epsilon}
            for mechanism in ("ddg", "skellam"):
                for label, k in (("no-wrap scale", None), ("papers' scale, k = 4", 4.0)):
                    row[f"{mechanism}, {label}"] = {b: distributed_z(mechanism, epsilon, b, setting, k) for b in BITS_1}
            out[f"{name}, central z = {zc:g}"] = row
    return out


def one_run(overrides: list[str]) -> dict[str, Any]:
    history = run_config(compose([*TASK, *overrides])).history
    last = history[-1]
    out = {"accuracy": last["eval/accuracy"], "rounds": len(history)}
    for key in ("secagg/dp/epsilon", "secagg/dp/noise_multiplier", "dp/epsilon", "secagg/scale"):
        if key in last:
            out[key] = last[key]
    if "secagg/dp/l2_sensitivity" in last:
        out["inflation"] = last["secagg/dp/l2_sensitivity"] * last["secagg/dp/gamma"] / CLIP  # Δ₂/ℓ
    out["wrapped"] = sum(r.get("secagg/wrapped", 0.0) for r in history)
    return out


def part_two(
    seeds: list[int], rounds: int, epsilons: list[float], ddg: list[int], skellam: list[int], sigma: list[int]
) -> dict[str, Any]:
    secure = ["secagg=secagg_plus", f"secagg.clip={CLIP}", f"num_rounds={rounds}"]
    configs = {"SecAgg+ without DP, b = 16": secure}
    for epsilon in epsilons:
        zc = central_z(epsilon, rounds, DELTA)
        configs[f"central DP, ε = {epsilon:g} (z = {zc:.3f})"] = [
            "dp=central",
            f"dp.noise_multiplier={zc}",
            f"dp.clip_norm={CLIP}",
            f"dp.delta={DELTA}",
            f"num_rounds={rounds}",
        ]
        for mechanism, bits in (("ddg", ddg), ("skellam", skellam)):
            for b in bits:
                configs[f"{mechanism}, ε = {epsilon:g}, b = {b}"] = [
                    *secure,
                    f"secagg.bits={b}",
                    f"secagg.dp.mechanism={mechanism}",
                    f"secagg.dp.epsilon={epsilon}",
                    f"secagg.dp.delta={DELTA}",
                ]
        for b in sigma:  # the papers' scale: more levels, wrap-around possible
            configs[f"ddg, ε = {epsilon:g}, b = {b}, papers' scale (k = 4)"] = [
                *configs[f"ddg, ε = {epsilon:g}, b = {ddg[0]}"],
                f"secagg.bits={b}",
                "secagg.scale_sigmas=4",
            ]
    results: dict[str, Any] = {}
    for name, overrides in configs.items():
        results[name] = {seed: one_run([*overrides, f"seed={seed}"]) for seed in seeds}
        print(f"{name}: {[round(r['accuracy'], 4) for r in results[name].values()]}", flush=True)
    return results


def _by_bits(entry: Any) -> Any:
    """A part-one row's entry as read back from JSON, its bits integers again (the labels' numbers stay as they are)."""
    return {int(b): z for b, z in entry.items()} if isinstance(entry, dict) else entry


def print_part_one(table: dict[str, Any]) -> None:
    for name, row in table.items():
        print(f"\n{name} (ε = {row['epsilon']:.4g}): z of the distributed mechanism / central z\n")
        print("| mechanism, scale | " + " | ".join(f"b = {b}" for b in BITS_1) + " |")
        print("|---|" + "---:|" * len(BITS_1))
        for label, zs in row.items():
            if label in ("central", "epsilon"):
                continue
            cells = ["–" if zs[b] is None else f"{zs[b] / row['central']:.3f}" for b in BITS_1]
            print(f"| {label} | " + " | ".join(cells) + " |")


def print_part_two(results: dict[str, Any]) -> None:
    print(
        "\n| configuration | final accuracy (mean ± sd) | per seed | ε (δ = 1e-6) | z | ℓ | Δ₂/ℓ | wrapped (seed 0) |"
    )
    print("|---|---|---|---|---|---:|---|---:|")
    for name, runs in results.items():
        acc = [r["accuracy"] for r in runs.values()]
        sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
        first = next(iter(runs.values()))  # the first seed's run
        eps = first.get("secagg/dp/epsilon", first.get("dp/epsilon"))
        eps_text = "–" if eps is None else f"{eps:.3f}" + (" (amplified)" if "dp/epsilon" in first else "")
        z = f"{first['secagg/dp/noise_multiplier']:.3f}" if "secagg/dp/noise_multiplier" in first else "–"
        levels = f"{first['secagg/scale'] * CLIP:.0f}" if "secagg/scale" in first else "–"
        inflation = f"{first['inflation']:.4f}" if "inflation" in first else "–"
        wrapped = f"{first['wrapped']:.0f}" if "secagg/scale" in first else "–"
        per_seed = ", ".join(f"{a:.4f}" for a in acc)
        print(
            f"| {name} | {statistics.fmean(acc):.4f} ± {sd:.4f} | {per_seed} | {eps_text} | {z} | {levels} | "
            f"{inflation} | {wrapped} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[5.0, 20.0])
    parser.add_argument("--ddg-bits", type=int, nargs="+", default=[12, 14, 16])
    parser.add_argument("--skellam-bits", type=int, nargs="+", default=[12, 16])
    parser.add_argument("--sigma-bits", type=int, nargs="*", default=[12])
    parser.add_argument("--part", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tables", action="store_true", help="print the tables of ddp.json, run nothing")
    args = parser.parse_args()
    path = HERE / "ddp.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    if args.tables:
        print_part_one({n: {k: _by_bits(v) for k, v in row.items()} for n, row in saved.get("noise", {}).items()})
        print_part_two(saved.get("accuracy", {}))
        return
    start, cpu = time.perf_counter(), time.process_time()
    if 1 in args.part:
        saved["noise"] = part_one()
        print_part_one(saved["noise"])
    if 2 in args.part:
        saved["accuracy"] = part_two(
            args.seeds, args.rounds, args.epsilons, args.ddg_bits, args.skellam_bits, args.sigma_bits
        )
        saved["accuracy_settings"] = vars(args)
        print_part_two(saved["accuracy"])
    path.write_text(json.dumps(saved, indent=1))
    print(f"\n{time.perf_counter() - start:.0f} s wall, {time.process_time() - cpu:.0f} s CPU")


if __name__ == "__main__":
    main()
