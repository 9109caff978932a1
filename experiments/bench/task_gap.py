"""The gap between two tasks of one worker: ProcessExecutor with and without the queued next task.

A ``TimedClient`` stamps the start and end of its ``fit`` inside the worker. For each worker, the gap is
the time from one task's end to the next task's start: sending the result, the parent reading it and
sending the next task, the worker reading it and loading the global weights. With a queued next task
(``QUEUE_DEPTH = 2``, the default) the next task is already in the worker's pipe; with ``QUEUE_DEPTH = 1``
(fedsim before 2026-12-03) the worker waits for the parent. The serial executor's gap (loading the
weights, nothing else) is the floor.

Workload: the FedProx paper's Synthetic(1,1), 100 natural clients (sizes 20-100+, ~4 ms of training
each with multinomial logistic regression), every client in every round, batch 10, 1 thread.
Contenders' rounds are interleaved; ``QUEUE_DEPTH`` is a module constant of the parent's side only, set
before each contender's round.

Run from the repository root::

    .venv/bin/python experiments/bench/task_gap.py            # ~1 minute
    .venv/bin/python experiments/bench/task_gap.py --rounds 9 --model 2nn
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from fedsim import Client, Workload
from fedsim.data.federated import federate, make_clients
from fedsim.data.partition import natural
from fedsim.data.synthetic import synthetic
from fedsim.executor import ProcessExecutor, SerialExecutor, pool
from fedsim.executor.base import Executor
from fedsim.models import MLP2NN, LogisticRegression
from fedsim.params import flatten
from fedsim.types import FitTask

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_executors import code_version, machine  # noqa: E402


class TimedClient(Client):
    """Stamps the wall-clock start and end of its ``fit`` into the update's metrics."""

    def fit(self, model, data, **kwargs):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        update = super().fit(model, data, **kwargs)
        return replace(update, metrics={**update.metrics, "t_start": start, "t_end": time.perf_counter()})


def gaps(results: list[Any]) -> list[float]:
    """Per worker, the time from each task's end to that worker's next task's start."""
    out: list[float] = []
    for worker in {r.worker for r in results}:
        mine = sorted((r for r in results if r.worker == worker), key=lambda r: r.metrics["t_start"])
        out += [b.metrics["t_start"] - a.metrics["t_end"] for a, b in zip(mine, mine[1:])]
    return out


def contenders(log_dir: Path) -> dict[str, tuple[Executor, int]]:
    """name -> (executor, QUEUE_DEPTH to set before its rounds)."""
    return {
        "serial_t1": (SerialExecutor(threads=1), 2),
        "process_w1_depth1": (ProcessExecutor(devices="cpu", workers=1, threads=1), 1),
        "process_w1_depth2": (ProcessExecutor(devices="cpu", workers=1, threads=1), 2),
        "process_w2_depth1": (ProcessExecutor(devices="cpu", workers=2, threads=1), 1),
        "process_w2_depth2": (ProcessExecutor(devices="cpu", workers=2, threads=1), 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", choices=("mlr", "2nn"), default="mlr")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per contender, after one warm-up")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results_task_gap.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    data = federate(synthetic(num_devices=100, seed=0), natural, client_test_fraction=0.2, seed=0)
    clients = make_clients(data, functools.partial(TimedClient, batch_size=10))
    model_cls = LogisticRegression if args.model == "mlr" else functools.partial(MLP2NN, hidden=200)
    model_factory = functools.partial(model_cls, input_shape=(60,), num_classes=10)
    global_params = flatten(model_factory())
    tasks = [FitTask(client_id=c.client_id, round_num=1, seed=c.client_id, config={}) for c in clients]
    rows: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        chosen = contenders(Path(tmp))
        for name, (executor, depth) in chosen.items():
            pool.QUEUE_DEPTH = depth
            executor.start(Workload(model_factory, clients, data.train, log_dir=Path(tmp) / name))
            rows[name] = {"round_s": [], "median_gap_ms": [], "sum_gaps_ms": []}
        try:
            for round_num in range(args.rounds + 1):
                for name, (executor, depth) in chosen.items():
                    pool.QUEUE_DEPTH = depth
                    start = time.perf_counter()
                    results = executor.fit(global_params, tasks)
                    wall = time.perf_counter() - start
                    if round_num:  # round 0 warms up
                        rows[name]["round_s"].append(wall)
                        rows[name]["median_gap_ms"].append(statistics.median(gaps(results)) * 1e3)
                        rows[name]["sum_gaps_ms"].append(sum(gaps(results)) * 1e3)
        finally:
            for executor, _ in chosen.values():
                executor.close()
    summary = {name: {key: statistics.median(values) for key, values in row.items()} for name, row in rows.items()}
    for name, row in summary.items():
        print(f"{name:20s} round {row['round_s'] * 1e3:7.1f} ms   gap between tasks {row['median_gap_ms']:.3f} ms "
              f"(median)   all gaps {row['sum_gaps_ms']:.1f} ms per round")
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "model": args.model, "code": code_version(),
                                    "machine": machine(), "summary": summary, "rounds": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
