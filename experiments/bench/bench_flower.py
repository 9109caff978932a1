"""fedsim vs Flower's simulation engine on one workload: same data, same sampled clients, rounds interleaved.

One invocation trains the workload of ``bench_executors.py`` (synthetic MNIST-shaped data, 100 IID
clients, 10 sampled per round, E=1, B=10, SGD lr 0.01, FedAvg; McMahan CNN and 2NN) with:

* ``process_w2``  fedsim ``Server`` + ``ProcessExecutor(devices="cpu", workers=2, threads=1)``
* ``serial_t1``   fedsim ``Server`` + ``SerialExecutor(threads=1)``
* ``flower``      Flower's Simulation Engine (Ray backend) with 2 concurrent virtual clients:
                  ``run_simulation(ServerApp, ClientApp, num_supernodes=100)`` with
                  ``client_resources={"num_cpus": 1}`` on a 2-CPU Ray, a Message-API ``ServerApp``
                  running ``flwr.serverapp.strategy.FedAvg.start`` (``configure_train`` overridden only
                  to pick fedsim's sampled clients), and a ``ClientApp`` whose ``@app.train()`` runs the
                  same plain PyTorch loop as fedsim's ``Client`` (``torch.set_num_threads(1)``).

Flower runs inside this process (``run_simulation`` starts its ServerApp in a thread and the
engine, Ray included, in another), so its rounds can be interleaved with fedsim's by the shared driver
(``harness.run_interleaved``): ``FedAvg.start`` calls ``evaluate_fn`` once before round 1 and once after every
round; ours reports "round r done" to the driver and then blocks until the driver starts round
r + 1. A Flower round, as timed, is therefore exactly one iteration of ``Strategy.start``'s loop:
``configure_train`` → ``grid.send_and_receive`` (messages through the in-memory SuperLink state to the
Ray actors and back) → ``aggregate_train`` → the (empty) evaluation stage → ``evaluate_fn``.

Why ``run_simulation`` and not ``flwr run``: Flower 1.42 marks ``run_simulation`` deprecated in favour
of the ``flwr run`` CLI, which starts a local SuperLink daemon that launches a ``flwr-simulation``
process, which calls the same ``_run_simulation`` (same in-memory grid, same engine, same Ray backend).
Only the in-process entry point lets one driver interleave Flower's rounds with fedsim's on the same
in-memory data and count Ray's processes as this script's own CPU. So the per-round path measured here is
the one ``flwr run`` executes; its start-up (CLI, SuperLink, app bundle, subprocess) is not measured.

Everything else (the workload: ``workload.py``; the quiet-second wait before each round, wall time, the
CPU of this script's process tree, the cores used by OTHER processes, ``--load N``: ``harness.py``) is
shared with the other benchmarks. The Flower side (ClientApp, ServerApp, ``FlowerContender``) is in
``flower_app.py``. The fedsim contenders use ``workload.TimedClient`` (a plain ``Client`` that stamps the
start and end of ``fit``) and the Flower client stamps its own start and end, so every round is also split
into head (round start to first client), tail (last client to round end), idle gaps between clients on a
worker or actor, and time inside the clients. ``--flower-poll-s`` is a diagnostic that changes Flower's
two 0.1 s polling intervals (see ``flower_app.set_flower_polling``). Ray starts its workers, Flower's actors, at
nice 15 (its ``worker_niceness``): on a busy machine they yield to every other process, fedsim's workers (nice 0)
do not; ``--ray-worker-niceness 0`` is the diagnostic that gives both the same share.
The ``flower`` contender needs Flower, which is not a fedsim dependency: run it in its own virtual
environment (see experiments/bench/README.md, "fedsim vs Flower"); the fedsim contenders alone
(``--contenders process_w2,serial_t1``) also run in fedsim's::

    /work/flower-venv/bin/python experiments/bench/bench_flower.py      # both models, ~5 min on 2 cores
    /work/flower-venv/bin/python experiments/bench/bench_flower.py --models 2nn --rounds-2nn 5
    /work/flower-venv/bin/python experiments/bench/bench_flower.py --load 1   # busy machine: results_flower_load1.json
"""

from __future__ import annotations

import os

# before flwr and ray are imported: no telemetry, no update checks, no usage stats (and no network here)
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from importlib.metadata import PackageNotFoundError, version  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (timing, reporting, --load)
import workload as wl  # noqa: E402  (the workload and the fedsim contender)

from fedsim import SerialExecutor, TensorData  # noqa: E402
from fedsim.client import evaluate_indices  # noqa: E402
from fedsim.executor import ProcessExecutor  # noqa: E402
from fedsim.params import flatten, load_flat  # noqa: E402

CONTENDERS = ("process_w2", "serial_t1", "flower")
# DIAGNOSTIC: process_w2 with the server's work on torch's default thread count (Schedule(threads=None)), as
# Server.run_round ran it before it applied schedule.threads itself
DIAGNOSTIC_CONTENDERS = ("process_w2_default_server_threads",)


class FedsimRun(wl.FedsimContender):
    """``workload.FedsimContender`` with ``TimedClient`` clients (a plain ``Client`` that stamps the wall-clock
    start and end of its ``fit``); keeps each round's metrics and updates, and splits each round."""

    def __init__(
        self, name: str, bench: wl.Bench, executor: Any, log_dir: Path, server_threads: int | None = 1
    ) -> None:
        super().__init__(
            name, bench, executor, log_dir, client_cls=wl.TimedClient, keep_updates=True, server_threads=server_threads
        )
        self.timeline: list[dict[str, Any]] = []

    def run_round(self, round_num: int) -> None:
        t0 = time.time()
        super().run_round(round_num)
        t1 = time.time()
        by_worker: dict[str, list[tuple[float, float]]] = {}
        for u in self.updates:
            by_worker.setdefault(u.worker, []).append((u.metrics["t_start"], u.metrics["t_end"]))
        self.timeline.append(wl.split_round(t0, t1, by_worker))

    def info(self) -> dict[str, Any]:
        return {
            **super().info(),
            "train_loss_per_round": [m.get("train/loss") for m in self.metrics],
            "timeline": self.timeline,
        }


# --------------------------------------------------------------------------------------------------
# checks that every contender really trained, and report


def held_out(num_train: int, num_test: int, seed: int) -> TensorData:
    """``num_test`` fresh examples labelled by the same random teacher as ``wl.mnist_shaped(num_train, seed)``:
    the same generator stream, continued after the teacher (the training set itself is not touched)."""
    gen = torch.Generator().manual_seed(seed)
    torch.rand((num_train, *wl.INPUT_SHAPE), generator=gen)  # the training images, skipped
    teacher = torch.randn(math.prod(wl.INPUT_SHAPE), wl.NUM_CLASSES, generator=gen)
    x = torch.rand((num_test, *wl.INPUT_SHAPE), generator=gen)
    y = ((x.reshape(num_test, -1) - 0.5) @ teacher).argmax(dim=1)
    return TensorData(x, y, wl.NUM_CLASSES)


def evaluate_flat(bench: wl.Bench, flat: torch.Tensor, test: TensorData) -> dict[str, float]:
    model = bench.model_factory()
    load_flat(model, flat)
    with torch.no_grad():
        result = evaluate_indices(model, test)
    return {"test_loss": result["loss"], "test_accuracy": result["accuracy"]}


def pairs(num: list[float], den: list[float]) -> list[float]:
    return [a / b for a, b in zip(num, den, strict=True)]


def compare(rows: dict[str, dict[str, Any]], results: dict[str, dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Ratios of medians, per-round ratios (rounds that ran back to back), the quiet ones, CPU ratios."""
    out: dict[str, Any] = {}
    for a, b in (("flower", "process_w2"), ("flower", "serial_t1"), ("serial_t1", "process_w2")):
        if a not in rows or b not in rows:
            continue
        per_round = pairs(rows[a]["timed_round_s"], rows[b]["timed_round_s"])
        loads = zip(results[a]["others_cores"][warmup:], results[b]["others_cores"][warmup:], strict=True)
        quiet = [r for r, load in zip(per_round, loads, strict=True) if max(load) < harness.QUIET["threshold_cores"]]
        cpu = pairs(results[a]["own_cpu_s"][warmup:], results[b]["own_cpu_s"][warmup:])
        out[f"{a}/{b}"] = {
            "medians": rows[a]["median_round_s"] / rows[b]["median_round_s"],
            "per_round": per_round,
            "per_round_median": statistics.median(per_round),
            "quiet_pairs": quiet,
            "quiet_pairs_median": statistics.median(quiet) if quiet else None,
            "cpu_per_round_median": statistics.median(cpu),
            "startup": rows[a]["startup_s"] / rows[b]["startup_s"] if rows[b]["startup_s"] > 0.05 else None,
        }
    return out


def report_model(
    model: str, bench: wl.Bench, rows: dict[str, Any], results: dict[str, Any], cmp: dict[str, Any], test: TensorData
) -> dict[str, Any]:
    init = bench.init_model()
    quality: dict[str, Any] = {"initial": evaluate_flat(bench, flatten(init), test)}
    for name, res in results.items():
        if "params" in res:
            quality[name] = evaluate_flat(bench, res["params"], test)
    ref_name = "serial_t1" if "serial_t1" in results else "process_w2"
    ref = results.get(ref_name, {}).get("params")
    diffs = {}
    for name in ("process_w2", *DIAGNOSTIC_CONTENDERS, "flower"):
        if ref is not None and name != ref_name and "params" in results.get(name, {}):
            delta = (results[name]["params"] - ref).abs()
            diffs[f"{name} vs {ref_name}"] = {
                "bitwise_equal": bool(torch.equal(results[name]["params"], ref)),
                "max_abs_diff": float(delta.max()),
                "rel_l2_diff": float(delta.norm() / ref.norm()),
            }
    for name, row in rows.items():
        row["warmup_round_s"] = results[name]["round_s"][: bench.warmup]
        row["startup_plus_warmup_s"] = row["startup_s"] + sum(row["warmup_round_s"])
        row["startup_plus_all_rounds_s"] = row["startup_s"] + sum(results[name]["round_s"])
        timed = row.get("timeline", [])[bench.warmup :]
        if timed and "head_s" in timed[0]:
            row["timeline_median"] = {
                k: statistics.median(t[k] for t in timed)
                for k in ("wall_s", "head_s", "tail_s", "gaps_s", "max_gap_s", "busy_s")
            }
    return {
        "contenders": rows,
        "comparison": cmp,
        "quality": quality,
        "final_weights": diffs,
        "num_params": sum(p.numel() for p in init.parameters()),
    }


def print_model(model: str, out: dict[str, Any]) -> None:
    rows = out["contenders"]
    harness.print_rows(
        f"{model} ({out['num_params']:,} parameters)", rows, extra=(("start+warm-up s", "startup_plus_warmup_s"),)
    )
    for key, c in out["comparison"].items():
        quiet = c["quiet_pairs_median"]
        print(
            f"{key}: {c['medians']:.2f}x (medians); per round {', '.join(f'{r:.2f}' for r in c['per_round'])}; "
            f"quiet pairs {len(c['quiet_pairs'])}, median {float('nan') if quiet is None else quiet:.2f}; "
            f"CPU {c['cpu_per_round_median']:.2f}x"
        )
    for name, q in out["quality"].items():
        loss = rows.get(name, {}).get("train_loss_per_round")
        trace = "" if loss is None else "; train loss per round " + ", ".join(f"{v:.4f}" for v in loss)
        print(f"{name:<12} test loss {q['test_loss']:.4f}, accuracy {q['test_accuracy']:.4f}{trace}")
    for key, d in out["final_weights"].items():
        print(
            f"final weights {key}: bitwise {d['bitwise_equal']}, max |diff| {d['max_abs_diff']:.3g}, "
            f"relative L2 {d['rel_l2_diff']:.3g}"
        )
    for name, row in rows.items():
        t = row.get("timeline_median")
        if t:
            print(
                f"{name:<12} timeline (median of timed rounds, s): wall {t['wall_s']:.3f} = head {t['head_s']:.3f} "
                f"+ tail {t['tail_s']:.3f} + ...; idle gaps between clients {t['gaps_s']:.3f} "
                f"(max {t['max_gap_s']:.3f}); time inside clients {t['busy_s']:.3f}"
            )
    flower = rows.get("flower")
    if flower:
        print(f"flower start-up: {json.dumps(flower['flower_startup'])}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    wl.add_workload_args(p, models="2nn,cnn")
    p.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help="comma-separated subset of: " + ",".join(CONTENDERS + DIAGNOSTIC_CONTENDERS),
    )
    harness.add_common_args(p, repeats=("--rounds", 8, "timed rounds per contender (CNN)"), warmup=1)
    p.add_argument(
        "--rounds-2nn", type=int, default=15, help="timed rounds per contender for the 2NN (short, noisy rounds)"
    )
    p.add_argument("--cpus", type=int, default=2, help="CPUs given to Flower's Ray (1 per virtual client)")
    p.add_argument("--test-examples", type=int, default=10_000, help="held-out examples for the final accuracy")
    p.add_argument(
        "--flower-poll-s",
        type=float,
        default=None,
        help="DIAGNOSTIC: poll interval of Flower's engine instead of its built-in 0.1 s (see set_flower_polling)",
    )
    p.add_argument("--idle-s", type=float, default=5.0, help="seconds to measure Flower's idle CPU after start-up")
    p.add_argument(
        "--ray-worker-niceness",
        type=int,
        default=None,
        help="DIAGNOSTIC: nice value of Ray's worker processes (Flower's actors) instead of Ray's default 15 "
        "(sets RAY_worker_niceness); 0 gives them the fair share of fedsim's workers on a busy machine",
    )
    return p.parse_args(argv)


def make_contender(name: str, bench: wl.Bench, model: str, data_path: Path, args: argparse.Namespace, tmp: Path) -> Any:
    if name == "process_w2":
        return FedsimRun(name, bench, ProcessExecutor(devices="cpu", workers=2, threads=1), tmp / model / name)
    if name == "process_w2_default_server_threads":
        executor = ProcessExecutor(devices="cpu", workers=2, threads=1)
        return FedsimRun(name, bench, executor, tmp / model / name, server_threads=None)
    if name == "serial_t1":
        return FedsimRun(name, bench, SerialExecutor(threads=1), tmp / model / name)
    if name == "flower":
        import flower_app  # needs Flower

        return flower_app.FlowerContender(name, bench, model, data_path, args.cpus, args.idle_s)
    raise ValueError(f"unknown contender {name}")


def versions() -> dict[str, str | None]:
    """flwr's and ray's versions (None where not installed: the fedsim contenders run without them)."""
    out: dict[str, str | None] = {"numpy": np.__version__}
    for package in ("flwr", "ray"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = None
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    data, shares = wl.mnist_clients(args)
    test = held_out(args.num_examples, args.test_examples, args.seed)
    if args.ray_worker_niceness is not None:  # read by Ray's raylet when it starts, which inherits our environment
        os.environ["RAY_worker_niceness"] = str(args.ray_worker_niceness)  # noqa: SIM112  (Ray spells it so)
    if args.flower_poll_s is not None:
        import flower_app  # needs Flower

        flower_app.set_flower_polling(args.flower_poll_s)
    report = harness.new_report(args, harness.HERE / "results_flower.json", **versions())
    report["flower_api"] = (
        "flwr.simulation.run_simulation (deprecated in flwr 1.42: its warning says to use "
        "`flwr run`) + Message API ServerApp/ClientApp + flwr.serverapp.strategy.FedAvg.start"
    )
    report["models"] = {}
    print(json.dumps(report["machine"]))
    with tempfile.TemporaryDirectory(prefix="fedsim-bench-flower-") as tmp, harness.busy_machine(args.load) as load:
        data_path = Path(tmp) / "train.pt"  # what Flower's ClientApps load (memory-mapped), written once, not timed
        torch.save({"x": data.x, "y": data.y, "shares": [torch.from_numpy(s) for s in shares]}, data_path)
        for model in args.models.split(","):
            rounds = args.rounds_2nn if model == "2nn" else args.rounds
            bench = wl.make_bench(model, data, shares, argparse.Namespace(**{**vars(args), "rounds": rounds}))
            contenders = [
                make_contender(n, bench, model, data_path, args, Path(tmp)) for n in args.contenders.split(",")
            ]
            results = harness.run_interleaved(contenders, bench.total_rounds, tag=model)
            rows = {k: harness.summarize(v, args.warmup) for k, v in results.items()}
            out = report_model(model, bench, rows, results, compare(rows, results, args.warmup), test)
            print_model(model, out)
            report["models"][model] = out
            report["load"] = load.record()
            harness.write_json(args.out, report)  # after each model, then once more with the load's final record
    report["load"] = load.record()
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
