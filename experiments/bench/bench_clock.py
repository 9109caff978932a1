"""The simulated clock's overhead: per-round wall time with device profiles on against the same run with them off.

Issue #18's target: "per-round wall time with profiles on is within 2 % of the same run with them off". Two measures,
in one run:

* ``rounds``: the default experiment (Synthetic(1,1), 30 devices, logistic regression, 10 clients per round,
  serial executor), ``clock=none`` against ``clock=sampled`` (always online, no deadline: the same clients train
  the same epochs, so the weights are bitwise equal and only the clock's own work differs), run round by round
  interleaved (the order alternating) so both meet the same background load; median wall time per round.
* ``planning``: the clock's own work per round in isolation (sampling among the online clients, planning every
  task's timing, the round's ``sim/`` metrics, advancing the clock) against the server's plain sampling, for
  30 and 10,000 clients; microseconds per round, and as a share of the end-to-end round time.

Run from the repository root::

    .venv/bin/python experiments/bench/bench_clock.py              # ~2 min here; writes results_clock.json
    .venv/bin/python experiments/bench/bench_clock.py --rounds 10  # smoke run
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

from fedsim.run import build_server, compose  # noqa: E402
from fedsim.seeding import sampling_rng  # noqa: E402
from fedsim.server import Server  # noqa: E402
from fedsim.sim.rounds import clocked_round  # noqa: E402

BASE = ["logger=quiet", "num_rounds=100000"]


class ServerRounds:
    """A contender for :func:`harness.run_interleaved`: one fedsim server, one round at a time."""

    def __init__(self, name: str, overrides: list[str]) -> None:
        self.name, self.server = name, build_server(compose([*BASE, *overrides]))

    def start(self) -> None:
        workload = self.server.workload()
        self.server.parts.local = workload.local
        self.server.parts.executor.start(workload)

    def run_round(self, round_num: int) -> None:
        self.last = self.server.run_round(round_num)

    def close(self) -> None:
        self.server.parts.executor.close()
        self.server.logger.close()

    def info(self) -> dict[str, Any]:
        return {"final_params_sum": float(self.server.params.double().sum())}


def planning_us(server: Server, rounds: int, clocked: bool) -> float:
    """Median microseconds of one round's planning (the clock's, or the plain sampling and configs)."""
    times = []
    for round_num in range(1, rounds + 1):
        start = time.perf_counter()
        if clocked:
            schedule, _ = clocked_round(
                server.parts.clock,
                server.strategy,
                round_num,
                sampling_rng(server.parts.seed, round_num),
                clients=server.clients,
                clients_per_round=server.parts.schedule.clients_per_round,
                config_of=functools.partial(server.parts.client_config, round_num),
                model_bytes=server.parts.comm.down_bytes,
                update_bytes=server.parts.comm.up_bytes,
            )
            schedule.metrics()
            server.parts.clock.advance(schedule)
        else:
            ids = server.strategy.sample(
                round_num,
                len(server.clients),
                server.parts.schedule.clients_per_round,
                sampling_rng(server.parts.seed, round_num),
            )
            {c: server.parts.client_config(round_num, c) for c in ids}
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def planning(rounds: int) -> dict[str, Any]:
    """Planning cost for the default 30 clients and for 10,000 (Synthetic with 10,000 small devices)."""
    out = {}
    for label, extra in (("30_clients", []), ("10000_clients", ["data.num_devices=10000", "+data.max_size=60"])):
        off = build_server(compose([*BASE, *extra]))
        on = build_server(compose([*BASE, *extra, "clock=sampled"]))
        out[label] = {"off_us": planning_us(off, rounds, False), "on_us": planning_us(on, rounds, True)}
        print(f"planning {label}: off {out[label]['off_us']:.0f} us, on {out[label]['on_us']:.0f} us", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_common_args(p, repeats=("--rounds", 120, "timed rounds per contender"), warmup=5, quiet_wait=2.0)
    args = p.parse_args(argv)
    report = {
        "command": " ".join(["python", *sys.argv]),
        **harness.new_report(args, harness.HERE / "results_clock.json"),
    }
    with harness.busy_machine(args.load) as load:
        rows = harness.run_interleaved(
            [ServerRounds("clock_off", []), ServerRounds("clock_sampled", ["clock=sampled"])],
            args.warmup + args.rounds,
            tag="clock",
        )
        report["load"] = load.record()
    summary = {name: harness.summarize(row, args.warmup) for name, row in rows.items()}
    ratio = harness.ratio(summary["clock_sampled"]["median_round_s"], summary["clock_off"]["median_round_s"])
    report["rounds"], report["ratio_on_over_off"] = summary, ratio
    report["planning"] = planning(2000)
    harness.print_rows("per-round wall time, default experiment (serial)", summary)
    print(
        f"\nclock on / off: {ratio:.4f} (target <= 1.02); the weights are equal: "
        f"{rows['clock_off']['final_params_sum'] == rows['clock_sampled']['final_params_sum']}"
    )
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
