"""Where does a fedsim round's time go? A timeline of every client task, per executor.

A ``TimedClient`` stamps the wall-clock start and end of its ``fit`` (inside the worker) into its
update's metrics. Each round is then split into: time the executor's workers spent inside
``Client.fit`` (busy), the gaps between one task's end and the next task's start on the same worker
(dispatch), the time before the first task starts (head: ``Server.run_round`` sampling, copying the
global weights) and after the last one ends (tail: results back, checks, aggregation). Same workload as
``bench_executors.py`` (``workload.py``: synthetic MNIST-shaped data, 100 IID clients, 10 per round). The
executors run one after another (``harness.run_interleaved`` with one contender at a time).

Run from the repository root::

    .venv/bin/python experiments/bench/diagnose_overhead.py --model 2nn
    .venv/bin/python experiments/bench/diagnose_overhead.py --model cnn --examples-per-client 60
    .venv/bin/python experiments/bench/diagnose_overhead.py --model 2nn --load 1   # busy machine
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (timing, reporting, --load)
import workload as wl  # noqa: E402  (the same workload and contender plumbing)
from workload import TimedClient  # noqa: E402, F401  (bench_flower imported it from here)

from fedsim import SerialExecutor  # noqa: E402
from fedsim.executor import ProcessExecutor  # noqa: E402
from fedsim.types import ClientUpdate  # noqa: E402


class TimelineContender(wl.FedsimContender):
    """fedsim's Server with ``TimedClient``s; per round, its task intervals and the parent's and workers' CPU."""

    def __init__(self, name: str, bench: wl.Bench, log_dir: Path) -> None:
        executor = (
            SerialExecutor(threads=1)
            if name == "serial_t1"
            else ProcessExecutor(devices="cpu", workers=int(name[-1]), threads=1)
        )
        super().__init__(  # the server's threads: --parent-threads or torch's default
            name, bench, executor, log_dir, client_cls=TimedClient, keep_updates=True, server_threads=None
        )
        self.records: list[dict[str, Any]] = []

    def run_round(self, round_num: int) -> None:
        parent0, workers0 = parent_cpu_s(), workers_cpu_s(self.executor)
        t0 = time.time()
        super().run_round(round_num)
        t1 = time.time()
        record = split_round(t0, t1, self.updates)
        record["parent_cpu_s"] = parent_cpu_s() - parent0
        record["workers_cpu_s"] = workers_cpu_s(self.executor) - workers0
        self.records.append(record)


def parent_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def workers_cpu_s(executor: Any) -> float:
    """CPU seconds of the executor's live worker processes so far (0 for the serial executor)."""
    total = 0.0
    for worker in getattr(executor, "workers", []):
        rest = Path(f"/proc/{worker.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(rest[11]) + int(rest[12])) / harness.CLOCK_TICKS
    return total


def split_round(t0: float, t1: float, updates: list[ClientUpdate]) -> dict[str, Any]:
    by_worker: dict[str, list[tuple[float, float]]] = {}
    for u in updates:
        by_worker.setdefault(u.worker, []).append((u.metrics["t_start"], u.metrics["t_end"]))
    busy = {w: sum(e - s for s, e in iv) for w, iv in by_worker.items()}
    gaps = {
        w: sum(b[0] - a[1] for a, b in zip(sorted(iv), sorted(iv)[1:], strict=False)) for w, iv in by_worker.items()
    }
    first = min(s for iv in by_worker.values() for s, _ in iv)
    last = max(e for iv in by_worker.values() for _, e in iv)
    return {
        "wall_s": t1 - t0,
        "head_s": first - t0,
        "tail_s": t1 - last,
        "busy_s": busy,
        "dispatch_gaps_s": gaps,
        "tasks": {w: len(iv) for w, iv in by_worker.items()},
        "mean_task_s": statistics.fmean(e - s for iv in by_worker.values() for s, e in iv),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", default="2nn", choices=sorted(wl.MODELS))
    p.add_argument("--executors", default="serial_t1,process_w1,process_w2")
    p.add_argument(
        "--parent-threads",
        type=int,
        default=None,
        help="torch.set_num_threads in this (the server) process first (default: torch's default)",
    )
    wl.add_workload_args(p, models=None)
    harness.add_common_args(p, repeats=("--rounds", 5, "timed rounds"), warmup=1)
    args = p.parse_args(argv)
    out_given = args.out is not None
    harness.new_report(args, harness.HERE / "diagnose_overhead.json")  # QUIET; a file only with --out
    if args.parent_threads:
        torch.set_num_threads(args.parent_threads)
    data, shares = wl.mnist_clients(args)
    bench = wl.make_bench(args.model, data, shares, args)
    report = {}
    print(
        f"{args.model}, {len(shares[0])} examples/client, "
        f"server process with {torch.get_num_threads()} intra-op threads; "
        f"per timed round (medians over {args.rounds}):"
    )
    print(
        f"{'executor':<12}{'wall':>8}{'head':>8}{'tail':>8}{'busy/worker':>13}{'gaps/worker':>13}{'task':>8}"
        f"{'cpu parent':>12}{'cpu workers':>13}{'others':>8}"
    )
    with tempfile.TemporaryDirectory() as tmp, harness.busy_machine(args.load) as load:
        for name in args.executors.split(","):
            contender = TimelineContender(name, bench, Path(tmp) / name)
            row = harness.run_interleaved([contender], bench.total_rounds, tag=name)[name]
            rounds = [
                {**r, "others_cores": o, "load_cores": c}
                for r, o, c in zip(contender.records, row["others_cores"], row["load_cores"], strict=True)
            ][args.warmup :]
            report[name] = rounds
            med = lambda key, rounds=rounds: statistics.median(r[key] for r in rounds)  # noqa: E731
            busy = statistics.median(statistics.fmean(r["busy_s"].values()) for r in rounds)
            gaps = statistics.median(statistics.fmean(r["dispatch_gaps_s"].values()) for r in rounds)
            print(
                f"{name:<12}{med('wall_s'):>8.3f}{med('head_s'):>8.3f}{med('tail_s'):>8.3f}{busy:>13.3f}{gaps:>13.4f}"
                f"{med('mean_task_s'):>8.3f}{med('parent_cpu_s'):>12.3f}{med('workers_cpu_s'):>13.3f}{med('others_cores'):>8.2f}"
            )
    print(
        "(seconds; busy = time inside Client.fit per worker; gaps = idle time between a worker's tasks; "
        "cpu = CPU seconds used in the round; others = cores used by other processes)"
    )
    if out_given:
        harness.write_json(args.out, {**report, "load": load.record()})


if __name__ == "__main__":
    main()
