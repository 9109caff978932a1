"""Consecutive runs on one Ray: new actors per run against actors kept from the run before (``reuse_actors``).

A Hydra sweep with the basic launcher, or a loop of runs in a notebook, runs one ``Server`` after another in the
same process. Each run below is the default experiment (Synthetic(1,1), logistic regression, FedAvg) shortened to
``--rounds`` rounds, on ``executor=ray`` with ``--workers`` actors, built and run as ``python -m fedsim`` does
(``fedsim.cli.run.compose`` + ``build_server``), on one local Ray started first. A run without reuse kills the
actors kept before it, so the two kinds cannot alternate run by run: they alternate in blocks of ``--block`` runs
(new, reused, new, reused, ...), each reused block after one untimed run that leaves the actors to be kept, so that
a slower stretch of the machine falls on both. Reported: the median seconds of a whole run (start-up, rounds,
close) of each kind, and the ratio. Every run's weights are checked equal to the first new run's (the same
experiment). Nothing here asserts a time.

Run from the repository root (about a minute on 2 cores)::

    .venv/bin/python experiments/bench/bench_ray_reuse.py
    .venv/bin/python experiments/bench/bench_ray_reuse.py --blocks 4 --block 3 --rounds 5 --workers 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=2, help="blocks of each kind")
    parser.add_argument("--block", type=int, default=3, help="timed runs per block")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    return parser.parse_args(argv)


def one_run(args: argparse.Namespace, reuse: bool) -> tuple[float, torch.Tensor]:
    from fedsim.cli.run import build_server, compose

    overrides = [f"num_rounds={args.rounds}", "executor=ray", f"executor.workers={args.workers}", "logger=quiet"]
    started = time.perf_counter()
    result = build_server(compose([*overrides, f"executor.reuse_actors={str(reuse).lower()}"])).run()
    return time.perf_counter() - started, result.params


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=args.workers, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    from fedsim.executor.ray import release_warm_actors

    _, reference = one_run(args, reuse=False)
    times: dict[str, list[float]] = {"new actors": [], "reused actors": []}
    for _ in range(args.blocks):
        for kind, reuse in (("new actors", False), ("reused actors", True)):
            release_warm_actors()  # a run without reuse would kill them at its start, inside its time
            if reuse:
                one_run(args, reuse=True)  # leaves its actors to the first timed run of the block
            for _ in range(args.block):
                seconds, params = one_run(args, reuse)
                assert torch.equal(params, reference), f"a run with {kind} gave other weights"
                times[kind].append(seconds)
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    print(f"{args.blocks} blocks of {args.block} runs of each kind, {args.rounds} rounds, {args.workers} actors:")
    for kind, values in times.items():
        print(f"  {kind:14} median {medians[kind]:.2f} s per run  ({', '.join(f'{v:.2f}' for v in values)})")
    print(f"  new / reused: {medians['new actors'] / medians['reused actors']:.1f}x")
    ray.shutdown()


if __name__ == "__main__":
    main()
