"""Soak test of ProcessExecutor: does a long run leak memory, file descriptors or shared memory?

Runs ``--rounds`` (200) rounds of FedAvg with ``ProcessExecutor(devices="cpu", workers=2)`` on
logistic regression over FedProx's Synthetic(1, 1) data (one client per device, ``natural``
partition), driving ``Server.run_round`` the way ``Server.run`` does, and every ``--every`` (10)
rounds samples, from /proc only:

* the server's resident memory (VmRSS), open file descriptors and threads;
* the same for each worker process (pid from ``executor.workers[i].process.pid``);
* the entries in /dev/shm (all of them, and those whose name holds one of our pids).

Then it runs ``--cycles`` (5) short start/run/close cycles in the same process and samples the
server after each ``close()``, as a Hydra multirun in one process would exercise it, and finally a
separate ``--attribution-rounds`` (100) run under ``tracemalloc`` that names the lines where the
server's Python heap grows (kept out of the main run: tracing inflates RSS by itself).

It writes the series to ``experiments/soak/results.json`` and prints first vs last after warm-up
(the sample at round ``--warmup-rounds``), with a verdict: counts must not change at all; memory
must stay within ``--rss-tolerance-mib``. This is a measurement, not a test: nothing asserts.

Run from the repository root::

    .venv/bin/python experiments/soak/soak.py              # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import torch

from fedsim import Client, FedAvg, RunLogger, Server, Workload, federate, make_clients
from fedsim.data.partition import natural
from fedsim.data.synthetic import synthetic
from fedsim.executor import ProcessExecutor
from fedsim.models import LogisticRegression
from fedsim.seeding import partition_seed
from fedsim.server import Evaluation, Federation, Schedule

HERE = Path(__file__).resolve().parent
COUNTS = ("fds", "threads")


def proc_status(pid: int | str) -> dict[str, int]:
    """Resident memory (KiB: all, anonymous), open file descriptors and threads of one process, from /proc.

    ``rss_anon_kib`` leaves out file-backed pages (the shared libraries of torch), so it is where a
    leak of Python objects or tensors shows first.
    """
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {
        "rss_kib": int(fields["VmRSS"].split()[0]),
        "rss_anon_kib": int(fields["RssAnon"].split()[0]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": int(fields["Threads"]),
    }


def shm_entries(pids: list[int]) -> dict[str, int]:
    names = os.listdir("/dev/shm")
    ours = [n for n in names if any(str(pid) in n for pid in pids)]
    return {"all": len(names), "ours": len(ours)}


def sample(round_num: int, executor: ProcessExecutor, started: float) -> dict[str, Any]:
    workers = {w.name: {"pid": w.process.pid, **proc_status(w.process.pid)} for w in executor.workers}
    pids = [os.getpid()] + [w["pid"] for w in workers.values()]
    return {
        "round": round_num,
        "elapsed_s": round(time.perf_counter() - started, 3),
        "server": proc_status("self"),
        "workers": workers,
        "shm": shm_entries(pids),
    }


def build(args: argparse.Namespace, run_dir: Path) -> tuple[Server, Workload, ProcessExecutor, RunLogger]:
    """The default experiment (Synthetic(1,1), logistic regression, FedAvg) on a ProcessExecutor."""
    split = synthetic(alpha=1.0, beta=1.0, num_devices=args.num_devices, seed=args.seed)
    data = federate(split, natural, client_test_fraction=0.2, seed=partition_seed(args.seed))
    client_factory = functools.partial(
        Client, epochs=1, batch_size=10, optimizer=functools.partial(torch.optim.SGD, lr=0.01)
    )
    clients = make_clients(data, client_factory)
    model_factory = functools.partial(
        LogisticRegression, input_shape=data.train.input_shape, num_classes=data.train.num_classes
    )
    executor = ProcessExecutor(devices="cpu", workers=args.workers, threads=1)
    logger = RunLogger(run_dir, tensorboard=False, progress=False, client_rows_in_memory=args.client_rows_in_memory)
    server = Server(
        model_factory=model_factory,
        federation=Federation(clients=clients, train_data=data.train, test_data=data.test),
        strategy=FedAvg(),
        executor=executor,
        schedule=Schedule(num_rounds=args.rounds, clients_per_round=args.per_round),
        seed=args.seed,
        logger=logger,
        evaluation=Evaluation(every=args.every),
    )
    return server, Workload(model_factory, clients, data.train, log_dir=logger.run_dir), executor, logger


def soak(args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    """Run every round, sampling between rounds; then one sample of the server after ``close()``."""
    server, workload, executor, logger = build(args, run_dir)
    before = {"server": proc_status("self"), "shm": shm_entries([os.getpid()])}
    started = time.perf_counter()
    executor.start(workload)  # what Server.run does, with a sample between rounds
    try:
        samples = [sample(0, executor, started)]
        for round_num in range(1, args.rounds + 1):
            logger.log_round(round_num, server.run_round(round_num))
            if round_num % args.every == 0:
                samples.append(sample(round_num, executor, started))
                samples[-1]["history_json_bytes"] = len(json.dumps(logger.history))  # RunLogger keeps every round
    finally:
        executor.close()
        logger.close()
    after = {"server": proc_status("self"), "shm": shm_entries([os.getpid()])}
    logs = {p.name: p.stat().st_size for p in sorted((run_dir / "workers").glob("*.log"))}
    last = logger.history[-1]
    return {
        "before_start": before,
        "samples": samples,
        "after_close": after,
        "worker_log_bytes": logs,
        "wall_s": time.perf_counter() - started,
        "final_eval": {k: v for k, v in last.items() if k.startswith("eval/")},
    }


def attribute_growth(args: argparse.Namespace, run_dir: Path, top: int = 6) -> dict[str, Any]:
    """A separate, traced run: where does the server's Python heap grow between round ``--warmup-rounds``
    and round ``--attribution-rounds``? (tracemalloc's own bookkeeping inflates RSS, so the main run is
    not traced.)"""
    server, workload, executor, logger = build(args, run_dir)
    tracemalloc.start()
    snapshots = []
    executor.start(workload)
    try:
        for round_num in range(1, args.attribution_rounds + 1):
            logger.log_round(round_num, server.run_round(round_num))
            if round_num in (args.warmup_rounds, args.attribution_rounds):
                snapshots.append(tracemalloc.take_snapshot())
    finally:
        executor.close()
        logger.close()
        tracemalloc.stop()
    diff = snapshots[1].compare_to(snapshots[0], "lineno")
    rounds = args.attribution_rounds - args.warmup_rounds
    return {
        "rounds": [args.warmup_rounds, args.attribution_rounds],
        "total_kib_per_round": round(sum(d.size_diff for d in diff) / 1024 / rounds, 2),
        "top": [
            {"where": str(d.traceback), "size_diff_kib": round(d.size_diff / 1024, 1), "count_diff": d.count_diff}
            for d in diff[:top]
        ],
    }


def cycles(args: argparse.Namespace, run_dir: Path) -> list[dict[str, Any]]:
    """``--cycles`` short runs (start, ``--cycle-rounds`` rounds, close) in this one process, as a Hydra
    multirun or a notebook would do; the server's numbers after every ``close()``."""
    out = []
    for cycle in range(1, args.cycles + 1):
        server, workload, executor, logger = build(args, run_dir / f"cycle-{cycle}")
        executor.start(workload)
        try:
            for round_num in range(1, args.cycle_rounds + 1):
                server.run_round(round_num)
        finally:
            executor.close()
            logger.close()
        out.append({"cycle": cycle, "server": proc_status("self"), "shm": shm_entries([os.getpid()])})
    return out


def series(samples: list[dict[str, Any]]) -> dict[str, list[float]]:
    """One list per quantity, e.g. ``server.rss_kib``, ``w0.fds``, ``shm.all`` (None where a worker is missing)."""
    out: dict[str, list[float]] = {}
    names = sorted({name for s in samples for name in s["workers"]})
    for s in samples:
        for key, value in s["server"].items():
            out.setdefault(f"server.{key}", []).append(value)
        for name in names:
            worker = s["workers"].get(name, {})
            for key in ("pid", "rss_kib", "rss_anon_kib", *COUNTS):
                out.setdefault(f"{name}.{key}", []).append(worker.get(key))
        for key, value in s["shm"].items():
            out.setdefault(f"shm.{key}", []).append(value)
    return out


def slope_per_100_rounds(rounds: list[int], values: list[float]) -> float:
    """Least-squares slope, per 100 rounds."""
    if len(rounds) < 2:
        return 0.0
    mx, my = statistics.fmean(rounds), statistics.fmean(values)
    var = sum((x - mx) ** 2 for x in rounds)
    return 100 * sum((x - mx) * (y - my) for x, y in zip(rounds, values, strict=True)) / var if var else 0.0


def summarize(samples: list[dict[str, Any]], warmup_rounds: int, rss_tolerance_mib: float) -> dict[str, Any]:
    """First (at ``warmup_rounds``) vs last value of every quantity, its slope and whether it is flat."""
    kept = [s for s in samples if s["round"] >= warmup_rounds]
    rounds = [s["round"] for s in kept]
    summary = {}
    for key, values in series(kept).items():
        if None in values:
            summary[key] = {
                "first": values[0],
                "last": values[-1],
                "flat": False,
                "note": "worker missing in some samples",
            }
            continue
        first, last = values[0], values[-1]
        if key.endswith(".pid"):
            summary[key] = {
                "first": first,
                "last": last,
                "flat": len(set(values)) == 1,
                "note": "same process throughout",
            }
            continue
        entry: dict[str, Any] = {
            "first": first,
            "last": last,
            "min": min(values),
            "max": max(values),
            "delta": last - first,
        }
        if "rss" in key:
            entry["slope_kib_per_100_rounds"] = round(slope_per_100_rounds(rounds, values), 1)
            entry["flat"] = abs(last - first) <= rss_tolerance_mib * 1024
        else:
            entry["flat"] = len(set(values)) == 1
        summary[key] = entry
    return summary


def print_summary(result: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"{args.rounds} rounds, {args.workers} workers, {args.per_round} clients/round, {args.num_devices} clients; "
        f"{result['wall_s']:.1f} s; sampled every {args.every} rounds; first = round {args.warmup_rounds}"
    )
    print(f"{'quantity':<20}{'first':>12}{'last':>12}{'delta':>10}{'min':>12}{'max':>12}  verdict")
    for key, e in result["summary"].items():
        if "slope_kib_per_100_rounds" in e:
            verdict = (
                f"within {args.rss_tolerance_mib:g} MiB"
                if e["flat"]
                else f"GREW more than {args.rss_tolerance_mib:g} MiB"
            )
        else:
            verdict = "flat" if e["flat"] else "NOT FLAT"
        extra = (
            f" (slope {e['slope_kib_per_100_rounds']:+.1f} KiB/100 rounds)" if "slope_kib_per_100_rounds" in e else ""
        )
        if "delta" not in e:
            print(f"{key:<20}{e['first']:>12}{e['last']:>12}{'':>10}{'':>12}{'':>12}  {verdict} ({e['note']})")
            continue
        print(
            f"{key:<20}{e['first']:>12}{e['last']:>12}{e['delta']:>+10}{e['min']:>12}{e['max']:>12}  {verdict}{extra}"
        )
    print(f"rss tolerance {args.rss_tolerance_mib} MiB; counts must not change at all")
    print(f"server before start: {result['before_start']}; after close: {result['after_close']}")
    print(f"worker log bytes: {result['worker_log_bytes']}; final eval: {result['final_eval']}")
    kept = [s for s in result["samples"] if s["round"] >= args.warmup_rounds]
    print(
        f"RunLogger.history as JSON: {kept[0]['history_json_bytes']} -> {kept[-1]['history_json_bytes']} bytes "
        f"(one record per round; client rows in memory: {args.client_rows_in_memory})"
    )
    growth = result["server_python_growth"]
    if growth:
        first, last = growth["rounds"]
        print(
            f"server Python heap growth in a separate traced run, round {first} -> {last} (tracemalloc): "
            f"{growth['total_kib_per_round']:+.2f} KiB/round in all; top sites:"
        )
        for g in growth["top"]:
            print(f"  {g['size_diff_kib']:+9.1f} KiB {g['count_diff']:+7d} blocks  {g['where']}")
    if result["cycles"]:
        print(
            f"{len(result['cycles'])} more start/{args.cycle_rounds} rounds/close cycles in this process; "
            "server after each close:"
        )
        for c in result["cycles"]:
            print(f"  cycle {c['cycle']}: {c['server']}  /dev/shm {c['shm']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--every", type=int, default=10, help="sample (and evaluate) every this many rounds")
    p.add_argument("--warmup-rounds", type=int, default=10, help="the first sample compared is the one at this round")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--num-devices", type=int, default=30, help="Synthetic devices = clients")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--client-rows-in-memory",
        action="store_true",
        help="keep the per-client rows in RunLogger.history too (the Python API's default; "
        "python -m fedsim keeps them in metrics.jsonl only, as this script does without the flag)",
    )
    p.add_argument("--rss-tolerance-mib", type=float, default=4.0)
    p.add_argument(
        "--attribution-rounds",
        type=int,
        default=100,
        help="length of the separate tracemalloc run that attributes the server's heap growth (0: skip)",
    )
    p.add_argument(
        "--cycles", type=int, default=5, help="then this many start/close cycles in the same process (0: none)"
    )
    p.add_argument("--cycle-rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=HERE / "results.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fedsim-soak-") as tmp:
        result = soak(args, Path(tmp) / "soak")
        result["cycles"] = cycles(args, Path(tmp)) if args.cycles else []
        result["server_python_growth"] = attribute_growth(args, Path(tmp) / "traced") if args.attribution_rounds else {}
    result["summary"] = summarize(result["samples"], args.warmup_rounds, args.rss_tolerance_mib)
    result["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    result["sharing_strategy"] = torch.multiprocessing.get_sharing_strategy()
    print_summary(result, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
