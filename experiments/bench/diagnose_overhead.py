"""Where does a fedsim round's time go? A timeline of every client task, per executor.

A ``TimedClient`` stamps the wall-clock start and end of its ``fit`` (inside the worker) into its
update's metrics. Each round is then split into: time the executor's workers spent inside
``Client.fit`` (busy), the gaps between one task's end and the next task's start on the same worker
(dispatch), the time before the first task starts (head: ``Server.run_round`` sampling, copying the
global weights) and after the last one ends (tail: results back, checks, aggregation). Same workload as
``bench_executors.py`` (synthetic MNIST-shaped data, 100 IID clients, 10 per round).

Run from the repository root::

    .venv/bin/python experiments/bench/diagnose_overhead.py --model 2nn
    .venv/bin/python experiments/bench/diagnose_overhead.py --model cnn --examples-per-client 60
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_executors as bench_mod  # noqa: E402  (the same workload and contender plumbing)

from fedsim import Client, FedAvg, SerialExecutor, Server, Workload  # noqa: E402
from fedsim.executor import ProcessExecutor  # noqa: E402
from fedsim.types import ClientUpdate  # noqa: E402


class TimedClient(Client):
    """A plain Client that records when its ``fit`` started and ended (wall clock, seconds)."""

    def fit(self, model, data, **kwargs) -> ClientUpdate:  # type: ignore[override]
        start = time.time()
        update = super().fit(model, data, **kwargs)
        return replace(update, metrics={**update.metrics, "t_start": start, "t_end": time.time()})


def timeline(executor_name: str, bench: bench_mod.Bench, log_dir: Path) -> list[dict[str, Any]]:
    """Run the rounds with one executor; return one record per round with its task intervals."""
    executor = SerialExecutor(threads=1) if executor_name == "serial_t1" else ProcessExecutor(
        devices="cpu", workers=int(executor_name[-1]), threads=1)
    optimizer = functools.partial(torch.optim.SGD, lr=bench.lr)
    clients = [TimedClient(i, idx, epochs=bench.epochs, batch_size=bench.batch_size, optimizer=optimizer)
               for i, idx in enumerate(bench.client_indices)]
    server = Server(model_factory=bench.model_factory, clients=clients, train_data=bench.data, test_data=None,
                    strategy=FedAvg(), executor=executor, num_rounds=bench.total_rounds,
                    clients_per_round=bench.per_round, seed=bench.seed)
    captured: list[list[ClientUpdate]] = []
    original = executor.fit

    def fit_and_keep(global_params, tasks):  # keep the updates the server is about to consume
        results = original(global_params, tasks)
        captured.append([r for r in results if isinstance(r, ClientUpdate)])
        return results

    executor.fit = fit_and_keep  # type: ignore[method-assign]
    executor.start(Workload(bench.model_factory, clients, bench.data, log_dir=log_dir))
    rounds = []
    try:
        for round_num in range(1, bench.total_rounds + 1):
            bench_mod.wait_for_quiet()
            meter = bench_mod.Meter()
            parent0, workers0 = parent_cpu_s(), workers_cpu_s(executor)
            t0 = time.time()
            server.run_round(round_num)
            t1 = time.time()
            _, others = meter.stop()
            record = split_round(t0, t1, captured[-1], others)
            record["parent_cpu_s"] = parent_cpu_s() - parent0
            record["workers_cpu_s"] = workers_cpu_s(executor) - workers0
            rounds.append(record)
    finally:
        executor.close()
    return rounds


def parent_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def workers_cpu_s(executor: Any) -> float:
    """CPU seconds of the executor's live worker processes so far (0 for the serial executor)."""
    total = 0.0
    for worker in getattr(executor, "workers", []):
        rest = Path(f"/proc/{worker.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(rest[11]) + int(rest[12])) / bench_mod.CLOCK_TICKS
    return total


def split_round(t0: float, t1: float, updates: list[ClientUpdate], others: float) -> dict[str, Any]:
    by_worker: dict[str, list[tuple[float, float]]] = {}
    for u in updates:
        by_worker.setdefault(u.worker, []).append((u.metrics["t_start"], u.metrics["t_end"]))
    busy = {w: sum(e - s for s, e in iv) for w, iv in by_worker.items()}
    gaps = {w: sum(b[0] - a[1] for a, b in zip(sorted(iv), sorted(iv)[1:])) for w, iv in by_worker.items()}
    first = min(s for iv in by_worker.values() for s, _ in iv)
    last = max(e for iv in by_worker.values() for _, e in iv)
    return {
        "wall_s": t1 - t0, "head_s": first - t0, "tail_s": t1 - last,
        "busy_s": busy, "dispatch_gaps_s": gaps, "tasks": {w: len(iv) for w, iv in by_worker.items()},
        "mean_task_s": statistics.fmean(e - s for iv in by_worker.values() for s, e in iv),
        "others_cores": others,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", default="2nn", choices=sorted(bench_mod.MODELS))
    p.add_argument("--executors", default="serial_t1,process_w1,process_w2")
    p.add_argument("--examples-per-client", type=int, default=None)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--parent-threads", type=int, default=None,
                   help="torch.set_num_threads in this (the server) process first (default: torch's default)")
    p.add_argument("--out", type=Path, default=None, help="also write the records as JSON here")
    args = p.parse_args(argv)
    if args.parent_threads:
        torch.set_num_threads(args.parent_threads)
    bargs = bench_mod.parse_args(["--rounds", str(args.rounds), "--warmup", str(args.warmup)])
    data = bench_mod.mnist_shaped(bargs.num_examples, bargs.seed)
    shares = bench_mod.iid(data.labels, num_clients=bargs.clients, seed=bargs.seed)
    if args.examples_per_client:
        shares = [s[: args.examples_per_client] for s in shares]
    bench = bench_mod.make_bench(args.model, data, shares, bargs)
    report = {}
    print(f"{args.model}, {len(shares[0])} examples/client, server process with {torch.get_num_threads()} intra-op threads; "
          f"per timed round (medians over {args.rounds}):")
    print(f"{'executor':<12}{'wall':>8}{'head':>8}{'tail':>8}{'busy/worker':>13}{'gaps/worker':>13}{'task':>8}"
          f"{'cpu parent':>12}{'cpu workers':>13}{'others':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.executors.split(","):
            rounds = timeline(name, bench, Path(tmp) / name)[args.warmup:]
            report[name] = rounds
            med = lambda key: statistics.median(r[key] for r in rounds)  # noqa: E731
            busy = statistics.median(statistics.fmean(r["busy_s"].values()) for r in rounds)
            gaps = statistics.median(statistics.fmean(r["dispatch_gaps_s"].values()) for r in rounds)
            print(f"{name:<12}{med('wall_s'):>8.3f}{med('head_s'):>8.3f}{med('tail_s'):>8.3f}{busy:>13.3f}{gaps:>13.4f}"
                  f"{med('mean_task_s'):>8.3f}{med('parent_cpu_s'):>12.3f}{med('workers_cpu_s'):>13.3f}{med('others_cores'):>8.2f}")
    print("(seconds; busy = time inside Client.fit per worker; gaps = idle time between a worker's tasks; "
          "cpu = CPU seconds used in the round; others = cores used by other processes)")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
