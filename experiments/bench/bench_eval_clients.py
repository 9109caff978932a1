"""Every-client evaluation (all 1,000 clients) against one centralized forward pass over the same examples.

Workload: FedProx's Synthetic(1,1) with ``--clients`` (1,000) devices at the default sizes (lognormal(4, 2) + 50
examples: heavy-tailed), ``partition=natural``, ``client_test_fraction=0.2``: 57,266 local test examples, 8 to
4,030 per client. Models: MLR (610 parameters) and the 2NN (54,410), at their initial weights. One thread per
process everywhere. Contenders (per model), one timed call per round, start-up excluded:

* ``central``      ``fedsim.client.example_losses`` over the concatenation of every client's test rows, batches of
                   ``EVAL_BATCH`` (1,024): the per-example losses the executors compute, in one pass (the baseline)
* ``central_sum``  ``fedsim.client.evaluate_indices`` over the same rows, batches of 1,024 (sums only)
* ``serial`` / ``process_w2`` / ``vmap``  ``executor.evaluate(params, tasks)``: ``SerialExecutor()``,
                   ``ProcessExecutor(devices="cpu", workers=2)``, ``VmapExecutor()``; ``tasks = eval_tasks(...)`` of
                   all clients, built once (groups of about ``EXAMPLES_PER_TASK`` = 2,048 examples)
* ``server_process_w2`` / ``server_vmap``  the whole ``Server.evaluate_clients`` (``evaluate_clients=all``):
                   building the tasks, ``evaluate``, ``summary`` (no run dir, so no CSV file)
* ``<executor>_ept<N>``  (``--examples-per-task N,...``) ``process_w2``/``vmap`` on tasks built with
                   ``fedsim.client.evaluation.EXAMPLES_PER_TASK = N`` (monkeypatched here, where tasks are built)

Ratios: medians over ``central``'s (goals: ``vmap`` within 2x, ``process_w2`` 3x). Checks: every executor's per-client
scores equal ``serial``'s bitwise, servers' metrics equal their ``summary``, ``central``'s per-client means (max diff).

Run from the repository root (``--load N``, ``--quiet-*``, ``--out``: see harness.py)::

    .venv/bin/python experiments/bench/bench_eval_clients.py            # ~5 minutes on 2 cores
    .venv/bin/python experiments/bench/bench_eval_clients.py --quick    # smoke run: 100 clients, 2 rounds
    .venv/bin/python experiments/bench/bench_eval_clients.py --models mlr --examples-per-task 512,8192,100000
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (timing, reporting, --load)

import fedsim.client.evaluation as client_eval  # noqa: E402
from fedsim import FedAvg, Server  # noqa: E402
from fedsim.client import Client, evaluate_indices, example_losses  # noqa: E402
from fedsim.client.federation import federate, make_clients  # noqa: E402
from fedsim.data.partition import natural  # noqa: E402
from fedsim.data.synthetic import synthetic  # noqa: E402
from fedsim.executor import ProcessExecutor, SerialExecutor, VmapExecutor, Workload  # noqa: E402
from fedsim.executor.eval_task import EVAL_BATCH  # noqa: E402
from fedsim.models import MLP2NN, LogisticRegression  # noqa: E402
from fedsim.params import flatten, load_flat  # noqa: E402
from fedsim.seeding import init_seed  # noqa: E402
from fedsim.server import Evaluation, Federation, Schedule
from fedsim.types import ClientFailure  # noqa: E402

MODELS = {"mlr": LogisticRegression, "2nn": MLP2NN}
CONTENDERS = ("central", "central_sum", "serial", "process_w2", "vmap", "server_process_w2", "server_vmap")
EXECUTORS = {
    "serial": lambda: SerialExecutor(threads=1),
    "process_w2": lambda: ProcessExecutor(devices="cpu", workers=2, threads=1),
    "vmap": lambda: VmapExecutor(threads=1),
}
GOALS = {"vmap": 2.0, "process_w2": 3.0}


class Contender:
    """``call()`` timed once per round (its value kept as ``last``); ``start``/``close`` around the whole run."""

    def __init__(
        self,
        name: str,
        call: Callable[[], Any],
        start: Callable[[], Any] = lambda: None,
        close: Callable[[], Any] = lambda: None,
        **info: Any,
    ) -> None:
        self.name, self.call, self.start, self.close, self.extra, self.last = name, call, start, close, info, None

    def run_round(self, round_num: int) -> None:
        self.last = self.call()

    def info(self) -> dict[str, Any]:
        return dict(self.extra)


def tasks_with(clients: list[Client], examples_per_task: int | None) -> list:
    """Every client's evaluation tasks, grouped by ``examples_per_task`` (None: fedsim's own constant)."""
    default = client_eval.EXAMPLES_PER_TASK
    client_eval.EXAMPLES_PER_TASK = examples_per_task or default
    try:
        return client_eval.eval_tasks(1, range(len(clients)), clients)
    finally:
        client_eval.EXAMPLES_PER_TASK = default


def make_contenders(
    names: list[str],
    epts: list[int],
    factory: Callable,
    clients: list[Client],
    data: Any,
    params: torch.Tensor,
    seed: int,
) -> list[Contender]:
    rows = torch.from_numpy(np.concatenate([c.test_indices for c in clients]))
    out = []
    for name in names:
        if name.startswith("central"):  # the weights loaded in each call, as every evaluation task does
            model = factory()

            def call(m: torch.nn.Module = model, sums: bool = name == "central_sum") -> Any:
                load_flat(m, params)
                evaluate = evaluate_indices if sums else functools.partial(example_losses, clients[0])
                return evaluate(m, data, rows, batch_size=EVAL_BATCH)

            out.append(Contender(name, call))
        elif name.startswith("server_"):
            ex = EXECUTORS[name[7:]]()
            server = Server(
                model_factory=factory,
                federation=Federation(clients=clients, train_data=data, test_data=None),
                strategy=FedAvg(),
                executor=ex,
                schedule=Schedule(num_rounds=1, clients_per_round=1),
                seed=seed,
                evaluation=Evaluation(clients=client_eval.ClientEvaluation("all")),
            )
            assert torch.equal(server.params, params)
            out.append(
                Contender(
                    name,
                    functools.partial(server.evaluate_clients, 1, []),
                    functools.partial(ex.start, server.workload()),
                    ex.close,
                )
            )  # noqa: SLF001 (what run() starts)
        else:
            for ept in [None] + (epts if name in GOALS else []):
                ex, tasks = EXECUTORS[name](), tasks_with(clients, ept)
                out.append(
                    Contender(
                        name + (f"_ept{ept}" if ept else ""),
                        functools.partial(ex.evaluate, params, tasks),
                        functools.partial(ex.start, Workload(factory, clients, data)),
                        ex.close,
                        tasks=len(tasks),
                    )
                )
    return out


def scores_of(results: list) -> list:
    assert not any(isinstance(r, ClientFailure) for r in results), [
        r.error for r in results if isinstance(r, ClientFailure)
    ]
    return [s for r in results for s in r.scores]


def checks(contenders: list[Contender], clients: list[Client]) -> dict[str, Any]:
    """Executors' scores against serial's (bitwise), servers' metrics against ``summary``, central's means."""
    by = {c.name: c.last for c in contenders if c.last is not None}
    if "serial" not in by:
        return {}
    ref = scores_of(by["serial"])
    out: dict[str, Any] = {
        f"{n}_scores_equal_serial": scores_of(v) == ref
        for n, v in by.items()
        if n != "serial" and not n.startswith(("central", "server_"))
    }
    out |= {
        f"{n}_metrics_equal_summary": v == client_eval.summary(ref, False)
        for n, v in by.items()
        if n.startswith("server_")
    }
    if "central" in by:
        (losses, correct), bounds = by["central"], np.cumsum([0] + [int(c.test_indices.size) for c in clients])
        pairs = [
            (float(losses[a:b].double().sum()) / (b - a), int(correct[a:b].sum()) / (b - a))
            for a, b in zip(bounds, bounds[1:], strict=False)
            if b > a
        ]
        out["central_max_abs_loss_diff"] = float(max(abs(p[0] - s.loss) for p, s in zip(pairs, ref, strict=True)))
        out["central_max_abs_accuracy_diff"] = float(
            max(abs(p[1] - s.accuracy) for p, s in zip(pairs, ref, strict=True))
        )
    return out


def fingerprint() -> dict[str, Any]:
    """The fedsim sources measured, by content (no git: the tree is shared with other jobs while this runs)."""
    root = harness.HERE.parents[1] / "fedsim"
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(root.rglob("*.py"))))
    return {"fedsim_sha256": digest.hexdigest()[:16], "fedsim": str(Path(client_eval.__file__).parent)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--models", default="mlr,2nn", help="comma-separated subset of: " + ",".join(MODELS))
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--examples-per-task", default="", help="comma-separated EXAMPLES_PER_TASK values to try as well")
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="smoke run: 100 clients, 2 timed rounds, no quiet wait")
    harness.add_common_args(p, repeats=("--rounds", 15, "timed rounds (calls) per contender"), warmup=2, quiet_wait=2.0)
    args = p.parse_args(argv)
    if args.quick:
        args.clients, args.rounds, args.warmup, args.quiet_wait = 100, 2, 1, 0.0
        args.out = (
            args.out or Path(tempfile.gettempdir()) / "results_eval_clients_quick.json"
        )  # a smoke run's: not kept
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    harness.code_version = fingerprint
    report = harness.new_report(args, harness.HERE / "results_eval_clients.json")
    data = federate(
        synthetic(num_devices=args.clients, seed=args.seed), natural, client_test_fraction=0.2, seed=args.seed
    )
    clients = make_clients(data, Client)
    sizes = [int(c.test_indices.size) for c in clients]
    report |= {
        "models": {},
        "workload": {
            "clients": len(clients),
            "test_examples": sum(sizes),
            "min": min(sizes),
            "median": float(np.median(sizes)),
            "max": max(sizes),
            "examples_per_task": client_eval.EXAMPLES_PER_TASK,
            "eval_batch": EVAL_BATCH,
        },
    }
    epts = [int(v) for v in args.examples_per_task.split(",") if v]
    with harness.busy_machine(args.load) as load:
        for model in args.models.split(","):
            factory = functools.partial(MODELS[model], (60,), 10)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(init_seed(args.seed))
                params = flatten(factory())  # the round-0 global model, as Server builds it
            contenders = make_contenders(
                args.contenders.split(","), epts, factory, clients, data.train, params, args.seed
            )
            results = harness.run_interleaved(contenders, args.warmup + args.rounds, tag=model)
            rows = {k: harness.summarize(v, args.warmup) for k, v in results.items()}
            base, best = (rows.get("central", {}).get(k) for k in ("median_round_s", "min_round_s"))
            for row in rows.values():  # on the medians (the goals) and on the fastest rounds (the least disturbed)
                row["ratio_to_central"] = harness.ratio(row["median_round_s"], base) or float("nan")
                row["min_ratio_to_central"] = harness.ratio(row["min_round_s"], best) or float("nan")
            harness.print_rows(
                f"{model}: seconds per evaluation of all {len(clients)} clients (median)",
                rows,
                extra=(("x central", "ratio_to_central"), ("min x central", "min_ratio_to_central")),
            )
            goals = {
                f"{n} within {g:g}x": rows[n]["ratio_to_central"] <= g for n, g in GOALS.items() if n in rows and base
            }
            sanity = checks(contenders, clients)
            print("  goals:", goals, "\n  checks:", sanity)
            report["models"][model] = {
                "contenders": rows,
                "goals": goals,
                "checks": sanity,
                "num_params": params.numel(),
            }
    report["load"] = load.record()
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
