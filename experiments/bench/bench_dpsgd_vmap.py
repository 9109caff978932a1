"""Local DP-SGD under executor=vmap: per-round wall time against the same clients trained non-privately under vmap.

Issue #19's target: "local DP-SGD on many small clients under vmap costs ≤ 1.5× non-private vmap".

Workload: Synthetic(1,1) (60 features, 10 classes) with ``--devices`` natural clients (default 1,000; sizes from
the FedProx generator, capped at ``--max-size`` examples, so 32–128 training examples per client with the
defaults), ``--per-round`` clients per round (default 100), one local epoch, SGD lr 0.05, FedAvg, no evaluation,
logistic regression (``logreg``, 610 parameters) and the 2NN (``mlp``, 54,410). Contenders, per model:

* ``vmap_dpsgd``    ``executor=vmap client=dpsgd`` (q = ``--sampling-rate``, z = 1, C = 1): ⌈1/q⌉ steps per epoch,
                    each on a Poisson batch of expected size q·n
* ``vmap_plain``    ``executor=vmap client=sgd`` with each client's ``batch_size`` set to ⌈q·n⌉ (the fair baseline:
                    ⌈n / ⌈q·n⌉⌉ ≤ ⌈1/q⌉ steps per epoch, each on ⌈q·n⌉ examples, so the same expected batch and
                    (nearly) the same steps; the table reports both contenders' local steps per round). What remains
                    is what DP-SGD adds: per-example clipping, the padding of Poisson batches (a vectorised step is
                    as wide as its chunk's largest batch) and the noise
* ``serial_dpsgd``  ``executor=serial client=dpsgd``: the reference vmap must match (relative error reported)

Rounds are interleaved by the shared driver (``harness.run_interleaved``: the order rotates every round, each round
waits for a quiet machine, 1 warm-up round). ``noise_s``: one round's Gaussian noise drawn alone (per client and step
one ``randn`` per parameter from a CPU generator, as DP-SGD draws it), the part of a DP-SGD round no executor can
vectorise away.

Run from the repository root (2-core shared machine: nice it)::

    nice -n 10 .venv/bin/python experiments/bench/bench_dpsgd_vmap.py               # writes results_dpsgd_vmap.json
    nice -n 10 .venv/bin/python experiments/bench/bench_dpsgd_vmap.py --models logreg --rounds 3   # smoke run
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

from fedsim.run import build_server, compose  # noqa: E402

CONTENDERS = ("vmap_dpsgd", "vmap_plain", "serial_dpsgd")


class ServerRounds:
    """A contender for :func:`harness.run_interleaved`: one fedsim server, one round at a time."""

    def __init__(self, name: str, overrides: list[str], batch_fraction: float | None = None) -> None:
        self.name, self.server = name, build_server(compose(overrides))
        if batch_fraction is not None:  # the non-private baseline: each client's batch is its expected Poisson batch
            for client in self.server.clients:
                client.batch_size = max(1, math.ceil(batch_fraction * client.num_train))
        self.steps: list[float] = []  # local steps of every round's clients together
        fit = self.server.parts.executor.fit

        def counted(global_params: torch.Tensor, tasks: Any) -> Any:
            results = fit(global_params, tasks)
            self.steps.append(sum(getattr(r, "metrics", {}).get("local_steps", 0.0) for r in results))
            return results

        self.server.parts.executor.fit = counted  # type: ignore[method-assign]

    def start(self) -> None:
        workload = self.server.workload()
        self.server.parts.local = workload.local
        self.server.parts.executor.start(workload)

    def run_round(self, round_num: int) -> None:
        self.server.run_round(round_num)

    def close(self) -> None:
        self.server.parts.executor.close()
        self.server.logger.close()

    def info(self) -> dict[str, Any]:
        return {
            "params": self.server.params.clone(),
            "local_steps_per_round": sum(self.steps) / max(len(self.steps), 1),
            "chunk_size": getattr(self.server.parts.executor, "_chunk", None),
        }


def contender(name: str, model: str, args: argparse.Namespace) -> ServerRounds:
    base = [
        "logger=quiet",
        "num_rounds=100000",
        "eval_every=100000",
        f"seed={args.seed}",
        f"model={model}",
        f"data.num_devices={args.devices}",
        f"+data.max_size={args.max_size}",
        f"clients_per_round={args.per_round}",
        "client.optimizer.lr=0.05",
    ]
    executor = ["executor=vmap", f"executor.threads={args.threads}"] if name.startswith("vmap") else ["executor=serial"]
    if name.endswith("dpsgd"):
        return ServerRounds(name, [*base, *executor, "client=dpsgd", f"client.sampling_rate={args.sampling_rate}"])
    return ServerRounds(name, [*base, *executor], batch_fraction=args.sampling_rate)


def noise_seconds(server: Any, steps: int, clients: int) -> float:
    """One round's DP-SGD noise drawn alone: ``clients`` × ``steps`` × one ``randn`` per trainable parameter."""
    shapes = [p.shape for p in server.model.parameters() if p.requires_grad]
    generators = [torch.Generator().manual_seed(k) for k in range(clients)]
    start = time.perf_counter()
    with torch.inference_mode():
        for generator in generators:
            for _ in range(steps):
                for shape in shapes:
                    torch.randn(shape, generator=generator)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="logreg,mlp")
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--devices", type=int, default=1000, help="data.num_devices: clients of the federation")
    p.add_argument(
        "--max-size", type=int, default=200, help="data.max_size: examples per device at most (before the test splits)"
    )
    p.add_argument("--per-round", type=int, default=100)
    p.add_argument("--sampling-rate", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="executor.threads of both vmap contenders")
    harness.add_common_args(p, repeats=("--rounds", 9, "timed rounds per contender"), warmup=1, quiet_wait=10.0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # the server's own work, as server_threads=1 does in a run
    report = {
        "command": " ".join(["python", *sys.argv]),
        **harness.new_report(args, harness.HERE / "results_dpsgd_vmap.json"),
    }
    report["models"] = {}
    with harness.busy_machine(args.load) as load:
        for model in args.models.split(","):
            contenders = [contender(name, model, args) for name in args.contenders.split(",")]
            rows = harness.run_interleaved(contenders, args.warmup + args.rounds, tag=model)
            summary = {name: harness.summarize(row, args.warmup) for name, row in rows.items()}
            params = {name: row["params"] for name, row in rows.items()}
            reference = params.get("serial_dpsgd")
            errors = {
                name: float((value - reference).norm() / reference.norm())
                for name, value in params.items()
                if reference is not None and name == "vmap_dpsgd"
            }
            noise = noise_seconds(contenders[0].server, math.ceil(1 / args.sampling_rate), args.per_round)
            median = {name: row.get("median_round_s") for name, row in summary.items()}
            ratios = {
                "vmap_dpsgd/vmap_plain": harness.ratio(median.get("vmap_dpsgd"), median.get("vmap_plain")),
                "serial_dpsgd/vmap_dpsgd": harness.ratio(median.get("serial_dpsgd"), median.get("vmap_dpsgd")),
            }
            report["models"][model] = {
                "contenders": summary,
                "ratios": ratios,
                "relative_error_vs_serial_dpsgd": errors,
                "noise_s_per_round": noise,
            }
            harness.print_rows(
                f"{model}: seconds per round (median of {args.rounds} timed rounds)",
                summary,
                extra=(("steps/round", "local_steps_per_round"),),
            )
            print(
                f"  ratios: { {k: round(v, 3) if v else None for k, v in ratios.items()} }; one round's noise alone: "
                f"{noise:.4f} s; relative error vs serial_dpsgd: {errors}"
            )
        report["load"] = load.record()
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
