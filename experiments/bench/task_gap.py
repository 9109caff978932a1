"""The gap between two tasks of one worker: ProcessExecutor with and without the queued next task.

A ``TimedClient`` stamps the start and end of its ``fit`` inside the worker. For each worker, the gap is
the time from one task's end to the next task's start: sending the result, the parent reading it and
sending the next task, the worker reading it and loading the global weights. With a queued next task
(``QUEUE_DEPTH = 2``, the default) the next task is already in the worker's pipe; with ``QUEUE_DEPTH = 1``
(fedsim before 2026-12-03) the worker waits for the parent. The serial executor's gap (loading the
weights, nothing else) is the floor.

Workload: the FedProx paper's Synthetic(1,1), 100 natural clients (sizes 20-100+, ~4 ms of training
each with multinomial logistic regression), every client in every round, batch 10, 1 thread.
Contenders' rounds are interleaved (``harness.run_interleaved``, in a fixed order, no quiet wait unless
``--quiet-wait``); ``QUEUE_DEPTH`` is a module constant of the parent's side only, set before each
contender's round (untimed).

Run from the repository root::

    .venv/bin/python experiments/bench/task_gap.py            # ~1 minute
    .venv/bin/python experiments/bench/task_gap.py --rounds 9 --model 2nn
    .venv/bin/python experiments/bench/task_gap.py --load 1   # busy machine: results_task_gap_load1.json
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from fedsim import Workload
from fedsim.client.federation import federate, make_clients
from fedsim.data.partition import natural
from fedsim.data.synthetic import synthetic
from fedsim.executor import ProcessExecutor, SerialExecutor
from fedsim.executor.base import Executor
from fedsim.executor.process import pool
from fedsim.models import MLP2NN, LogisticRegression
from fedsim.params import flatten
from fedsim.types import FitTask

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (timing, reporting, --load)
from workload import TimedClient  # noqa: E402  (stamps the start and end of its fit)


def gaps(results: list[Any]) -> list[float]:
    """Per worker, the time from each task's end to that worker's next task's start."""
    out: list[float] = []
    for worker in {r.worker for r in results}:
        mine = sorted((r for r in results if r.worker == worker), key=lambda r: r.metrics["t_start"])
        out += [b.metrics["t_start"] - a.metrics["t_end"] for a, b in zip(mine, mine[1:], strict=False)]
    return out


class GapContender:
    """One executor fitting every client per round, with ``pool.QUEUE_DEPTH`` set before its rounds."""

    def __init__(
        self, name: str, executor: Executor, depth: int, workload: Workload, global_params: Any, tasks: list[FitTask]
    ) -> None:
        self.name, self.executor, self.depth, self.workload = name, executor, depth, workload
        self.global_params, self.tasks = global_params, tasks
        self.gaps: list[list[float]] = []

    def start(self) -> None:
        self.prepare(0)
        self.executor.start(self.workload)

    def prepare(self, round_num: int) -> None:
        pool.QUEUE_DEPTH = self.depth

    def run_round(self, round_num: int) -> None:
        self.gaps.append(gaps(self.executor.fit(self.global_params, self.tasks)))

    def close(self) -> None:
        self.executor.close()

    def info(self) -> dict[str, Any]:
        return {"gaps": self.gaps}


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
    harness.add_common_args(
        parser, repeats=("--rounds", 5, "timed rounds per contender, after one warm-up"), warmup=None, quiet_wait=0.0
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    head = harness.new_report(args, harness.HERE / "results_task_gap.json")
    data = federate(synthetic(num_devices=100, seed=0), natural, client_test_fraction=0.2, seed=0)
    clients = make_clients(data, functools.partial(TimedClient, batch_size=10))
    model_cls = LogisticRegression if args.model == "mlr" else functools.partial(MLP2NN, hidden=200)
    model_factory = functools.partial(model_cls, input_shape=(60,), num_classes=10)
    global_params = flatten(model_factory())
    tasks = [FitTask(client_id=c.client_id, round_num=1, seed=c.client_id, config={}) for c in clients]
    with tempfile.TemporaryDirectory() as tmp, harness.busy_machine(args.load) as load:
        chosen = [
            GapContender(
                name,
                executor,
                depth,
                Workload(model_factory, clients, data.train, log_dir=Path(tmp) / name),
                global_params,
                tasks,
            )
            for name, (executor, depth) in contenders(Path(tmp)).items()
        ]
        results = harness.run_interleaved(chosen, args.rounds + 1, tag=args.model, rotate=False)  # round 1 warms up
    rows = {
        name: {
            "round_s": r["round_s"][1:],
            "median_gap_ms": [statistics.median(g) * 1e3 for g in r["gaps"][1:]],
            "sum_gaps_ms": [sum(g) * 1e3 for g in r["gaps"][1:]],
            "others_cores": r["others_cores"][1:],
            "load_cores": r["load_cores"][1:],
        }
        for name, r in results.items()
    }
    summary = {name: {key: statistics.median(values) for key, values in row.items()} for name, row in rows.items()}
    for name, row in summary.items():
        print(
            f"{name:20s} round {row['round_s'] * 1e3:7.1f} ms   gap between tasks {row['median_gap_ms']:.3f} ms "
            f"(median)   all gaps {row['sum_gaps_ms']:.1f} ms per round"
        )
    harness.write_json(
        args.out,
        {
            "command": " ".join(sys.argv),
            "model": args.model,
            **head,
            "load": load.record(),
            "summary": summary,
            "rounds": rows,
        },
    )


if __name__ == "__main__":
    main()
