"""Central DP's overhead: per-round wall time of DP-FedAvg (fixed and adaptive clipping) against the same rounds
without privacy.

Issue #19's target: DP-FedAvg on the 2NN costs at most 1.1x a plain round. The workload is the other benchmarks'
(``workload.py``: McMahan et al.'s MNIST-shaped data, 100 clients of 600, E=1, B=10, SGD lr 0.01, serial executor,
1 thread, no evaluation). DP runs sample clients by Poisson sampling (q = 10/100), so the plain contender samples the
same way (a FedAvg whose ``sample`` is the same Poisson draw from the same generator): every contender trains the
same clients each round and only the server's privacy work differs. Rounds are interleaved with the order rotating;
the median wall time per round, its ratio to ``plain``, and the time spent in the DP server step
(``PrivateRounds.aggregate_input``: clipping, the noisy sum, the ledger), timed inside the round.

Run from the repository root::

    nice -n 10 .venv/bin/python experiments/bench/bench_dp.py --quiet-wait 0              # writes results_dp.json
    .venv/bin/python experiments/bench/bench_dp.py --rounds 1 --examples-per-client 60      # smoke run
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import workload  # noqa: E402

from fedsim import Client, FedAvg, Server  # noqa: E402
from fedsim.core.threads import torch_threads  # noqa: E402
from fedsim.executor import SerialExecutor, Workload  # noqa: E402
from fedsim.privacy import CentralDP  # noqa: E402
from fedsim.privacy.sampling import poisson_sample  # noqa: E402
from fedsim.server import Federation, Schedule, Stages

SETTINGS: dict[str, CentralDP | None] = {
    "plain": None,
    "central": CentralDP(noise_multiplier=1.0, clip_norm=1.0),
    "adaptive": CentralDP(noise_multiplier=1.0, clip_norm=0.1, adaptive=True, count_noise=1.0),
}


class PoissonFedAvg(FedAvg):
    """FedAvg sampling as DP runs do: every client with probability clients_per_round / num_clients."""

    def sample(self, round_num: int, num_clients: int, clients_per_round: int, rng: np.random.Generator) -> list[int]:
        return poisson_sample(rng, num_clients, clients_per_round / num_clients)


class DPRounds:
    """A contender for :func:`harness.run_interleaved`: fedsim's Server with one privacy setting."""

    def __init__(self, name: str, bench: workload.Bench, log_dir: Path) -> None:
        self.name, self.bench, self.log_dir = name, bench, log_dir
        optimizer = functools.partial(torch.optim.SGD, lr=bench.lr)
        clients = [
            Client(i, idx, epochs=bench.epochs, batch_size=bench.batch_size, optimizer=optimizer)
            for i, idx in enumerate(bench.client_indices)
        ]
        dp = SETTINGS[name]
        self.server = Server(
            model_factory=bench.model_factory,
            federation=Federation(clients=clients, train_data=bench.data, test_data=None),
            strategy=PoissonFedAvg() if dp is None else FedAvg(),
            executor=SerialExecutor(threads=1),
            schedule=Schedule(num_rounds=bench.total_rounds, clients_per_round=bench.per_round),
            seed=bench.seed,
            stages=Stages(privacy=dp),
        )
        self.dp_s: list[float] = []
        self.cohorts: list[int] = []
        if self.server.parts.privacy is not None:
            harness.time_calls(self.server.parts.privacy, "aggregate_input", self.dp_s.append)

    def start(self) -> None:
        workload_ = Workload(
            self.bench.model_factory,
            self.server.clients,
            self.bench.data,
            log_dir=self.log_dir,
            local=self.server.strategy.local_training(),
        )
        self.server.parts.local = workload_.local
        self.server.parts.executor.start(workload_)

    def run_round(self, round_num: int) -> None:
        with torch_threads(self.server.threads):  # as Server.run
            metrics = self.server.run_round(round_num)
        self.cohorts.append(int(metrics["client/num_sampled"]))

    def close(self) -> None:
        self.server.parts.executor.close()

    def info(self) -> dict[str, Any]:
        return {"dp_s": self.dp_s, "cohorts": self.cohorts}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_common_args(p, repeats=("--rounds", 10, "timed rounds per contender"), warmup=1, quiet_wait=5.0)
    workload.add_workload_args(p, models="2nn")
    args = p.parse_args(argv)
    report = {"command": " ".join(["python", *sys.argv]), **harness.new_report(args, harness.HERE / "results_dp.json")}
    data, shares = workload.mnist_clients(args)
    bench = workload.make_bench(args.models.split(",")[0], data, shares, args)
    with harness.busy_machine(args.load) as load, tempfile.TemporaryDirectory() as log_dir:
        rows = harness.run_interleaved(
            [DPRounds(n, bench, Path(log_dir)) for n in SETTINGS], bench.total_rounds, tag="dp"
        )
        report["load"] = load.record()
    summary = {name: harness.summarize(row, args.warmup) for name, row in rows.items()}
    assert len({tuple(r["cohorts"]) for r in summary.values()}) == 1, "the contenders trained different cohorts"
    for row in summary.values():
        row["ratio_to_plain"] = harness.ratio(row["median_round_s"], summary["plain"]["median_round_s"])
        row["paired_ratio_to_plain"] = statistics.median(
            t / b for t, b in zip(row["timed_round_s"], summary["plain"]["timed_round_s"], strict=True)
        )
        row["median_dp_ms"] = statistics.median(row["dp_s"][args.warmup :]) * 1e3 if row["dp_s"] else 0.0
    report["rounds"] = summary
    harness.print_rows(
        f"DP-FedAvg, {bench.num_params():,} parameters, serial executor",
        summary,
        extra=(
            ("ratio to plain", "ratio_to_plain"),
            ("paired", "paired_ratio_to_plain"),
            ("DP step ms", "median_dp_ms"),
        ),
    )
    for name in ("central", "adaptive"):
        ratio = summary[name]["paired_ratio_to_plain"]
        print(f"{name} / plain (paired): {ratio:.3f} (target <= 1.1): {'met' if ratio <= 1.1 else 'NOT met'}")
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
