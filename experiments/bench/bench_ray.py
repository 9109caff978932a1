"""Ray executor vs process executor on one machine: same workload, rounds interleaved, one invocation.

Contenders (per model), both fedsim ``Server`` + FedAvg driven as ``Server.run`` drives it:

* ``process_w2``  ``ProcessExecutor(devices="cpu", workers=2, threads=1)``
* ``ray_w2``      ``RayExecutor(workers=2, threads=1)``: 2 CPU actors on a local Ray started by this
                  script (``ray.init`` with the arguments ``RayExecutor`` uses when it starts Ray itself)

The workload (``workload.py``), the interleaving (round r of each contender in turn, order rotating every
round, each round after a quiet second when one comes) and the measurements (wall time, CPU of this
script's process tree, cores used by other processes) are the shared harness's (``harness.py``).
Ray's start-up (``ray.init``) and each executor's start-up (actors / workers ready) are timed apart
from the rounds. Before the rounds, a small probe times ``ray.get`` of an actor's return: an empty
call, and a flat update of each model's size as a tensor and as a NumPy array. Reported: per-round
times, their median, and ray/process per model, both as the ratio of medians and as the spread of
the per-round ratios (round r of ray over round r of process, which ran back to back), also
restricted to the pairs in which other processes stayed below the quiet threshold during both
rounds (outside load comes in bursts and distorts single pairs). Nothing here asserts a time.

Run from the repository root::

    .venv/bin/python experiments/bench/bench_ray.py                  # both models, ~5 min on 2 cores
    .venv/bin/python experiments/bench/bench_ray.py --models 2nn --rounds 10
    .venv/bin/python experiments/bench/bench_ray.py --load 1          # busy machine: results_ray_load1.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (timing, reporting, --load)
import workload as wl  # noqa: E402  (the shared workload and contenders)

from fedsim.executor import ProcessExecutor, RayExecutor  # noqa: E402

CONTENDERS = ("process_w2", "ray_w2")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    wl.add_workload_args(p, models="cnn,2nn")
    harness.add_common_args(p, repeats=("--rounds", 8, "timed rounds per contender"), warmup=1)
    return p.parse_args(argv)


def start_ray() -> float:
    """Start a local Ray as ``RayExecutor`` would (2 CPUs, no dashboard, loopback); seconds it took."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    start = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=True)
    return time.perf_counter() - start


def idle_cores(seconds: float = 5.0) -> float:
    """Cores this script's process tree (server, idle workers, idle actors, Ray's daemons) uses while idle."""
    meter = harness.Meter()
    time.sleep(seconds)
    wall, _ = meter.stop()
    return meter.own_cpu_s / wall


class _Echo:
    """An actor that returns a flat vector of ``n`` floats, as a tensor or as a NumPy array."""

    def __init__(self, n: int) -> None:
        self.flat = torch.randn(n)

    def noop(self) -> None:
        return None

    def as_tensor(self) -> torch.Tensor:
        return self.flat.clone()

    def as_array(self) -> Any:
        return self.flat.clone().numpy()


def transfer_ms(sizes: dict[str, int], calls: int = 30) -> dict[str, dict[str, float]]:
    """Milliseconds per ``ray.get(actor.method.remote())``: an empty call, and an update of each model's
    size returned as a tensor (pickled) or as an array (zero-copy out-of-band buffer, what fedsim uses)."""
    out: dict[str, dict[str, float]] = {}
    for model, n in sizes.items():
        actor = ray.remote(num_cpus=1)(_Echo).remote(n)
        row = {}
        for method in ("noop", "as_tensor", "as_array"):
            call = getattr(actor, method)
            ray.get(call.remote())
            start = time.perf_counter()
            for _ in range(calls):
                ray.get(call.remote())
            row[method] = (time.perf_counter() - start) / calls * 1e3
        out[model] = row
        ray.kill(actor)
    return out


def make_contender(name: str, bench: wl.Bench, log_dir: Path) -> wl.FedsimContender:
    if name == "process_w2":
        executor: Any = ProcessExecutor(devices="cpu", workers=2, threads=1)
    else:
        executor = RayExecutor(workers=2, threads=1)  # joins the Ray started above; does not own it
    return wl.FedsimContender(name, bench, executor, log_dir / name)


def compare(rows: dict[str, dict[str, Any]], results: dict[str, dict[str, Any]], warmup: int) -> dict[str, Any]:
    """ray/process: ratio of medians, and the spread of per-round ratios (rounds that ran back to back)."""
    proc, ray_ = rows["process_w2"], rows["ray_w2"]
    pairs = [r / p for r, p in zip(ray_["timed_round_s"], proc["timed_round_s"], strict=True)]
    cpu = [
        r / p
        for r, p in zip(
            results["ray_w2"]["own_cpu_s"][warmup:], results["process_w2"]["own_cpu_s"][warmup:], strict=True
        )
    ]
    others = zip(
        results["ray_w2"]["others_cores"][warmup:], results["process_w2"]["others_cores"][warmup:], strict=True
    )
    quiet = [pair for pair, load in zip(pairs, others, strict=True) if max(load) < harness.QUIET["threshold_cores"]]
    return {
        "ray/process_quiet_pairs": quiet,  # rounds in which other processes used < threshold cores in both
        "ray/process_quiet_pairs_median": statistics.median(quiet) if quiet else None,
        "ray/process_median": ray_["median_round_s"] / proc["median_round_s"],
        "ray/process_per_round": pairs,
        "ray/process_per_round_median": statistics.median(pairs),
        "ray/process_per_round_min": min(pairs),
        "ray/process_per_round_max": max(pairs),
        "ray/process_cpu_per_round_median": statistics.median(cpu),
        "target_within_1.3x": ray_["median_round_s"] / proc["median_round_s"] <= 1.3,
        "bitwise_equal_final_weights": bool(torch.equal(results["ray_w2"]["params"], results["process_w2"]["params"])),
    }


def print_model(model: str, rows: dict[str, dict[str, Any]], cmp: dict[str, Any]) -> None:
    harness.print_rows(model, rows)
    pairs = ", ".join(f"{r:.2f}" for r in cmp["ray/process_per_round"])
    print(
        f"ray/process: {cmp['ray/process_median']:.3f}x (medians); per round {pairs} "
        f"(median {cmp['ray/process_per_round_median']:.3f}, min {cmp['ray/process_per_round_min']:.3f}, "
        f"max {cmp['ray/process_per_round_max']:.3f}); quiet pairs {len(cmp['ray/process_quiet_pairs'])}, median "
        f"{cmp['ray/process_quiet_pairs_median'] or float('nan'):.3f}; "
        f"CPU {cmp['ray/process_cpu_per_round_median']:.3f}x; "
        f"within 1.3x: {cmp['target_within_1.3x']}; bitwise equal: {cmp['bitwise_equal_final_weights']}"
    )


def run_model(model: str, data: Any, shares: list[Any], args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    bench = wl.make_bench(model, data, shares, args)
    contenders = [make_contender(name, bench, tmp / model) for name in CONTENDERS]
    results = harness.run_interleaved(contenders, bench.total_rounds, tag=model)
    rows = {k: harness.summarize(v, args.warmup) for k, v in results.items()}
    cmp = compare(rows, results, args.warmup)
    print_model(model, rows, cmp)
    return {"contenders": rows, "comparison": cmp, "num_params": bench.num_params()}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    data, shares = wl.mnist_clients(args)
    report = harness.new_report(args, harness.HERE / "results_ray.json", ray=ray.__version__)
    report["models"] = {}
    print(json.dumps(report["machine"]))
    with harness.busy_machine(args.load) as load:
        report["ray_init_s"] = start_ray()
        print(f"ray.init: {report['ray_init_s']:.2f} s")
        try:
            report["idle_cores_with_ray_up"] = idle_cores()
            print(f"this script's processes while idle, Ray up: {report['idle_cores_with_ray_up']:.3f} cores")
            sizes = {
                m: sum(p.numel() for p in wl.MODELS[m](wl.INPUT_SHAPE, wl.NUM_CLASSES).parameters())
                for m in args.models.split(",")
            }
            report["transfer_ms"] = transfer_ms(sizes)
            print(
                "ray.get of an actor's return, ms (empty call / update as tensor / as array): "
                f"{json.dumps(report['transfer_ms'])}"
            )
            with tempfile.TemporaryDirectory(prefix="fedsim-bench-ray-") as tmp:
                for model in args.models.split(","):
                    report["models"][model] = run_model(model, data, shares, args, Path(tmp))
        finally:
            ray.shutdown()
    report["load"] = load.record()
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
