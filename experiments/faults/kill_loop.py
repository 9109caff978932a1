"""Kill a random worker every second, replacements included: the run must never hang.

Runs FedAvg on Synthetic(1,1) with ``--executor process`` (2 workers) or ``ray`` (2 actors on a local Ray)
for ``--rounds`` rounds while a thread SIGKILLs one of the live workers (chosen at random, the worker being
started included; under Ray the actors' processes and Ray's idle pooled workers, not its agents) every
``--interval`` seconds for ``--seconds`` seconds or until ``--kills`` workers were killed, whichever comes
first. Each repeat must end either with weights bitwise equal to the serial executor's or with one line (a
round that ran out of retries, a worker slot that failed to start 3 times in a row), within ``--limit``
seconds. Prints one JSON line per repeat.

    .venv/bin/python experiments/faults/kill_loop.py --repeats 5 --seconds 45
    .venv/bin/python experiments/faults/kill_loop.py --executor ray --repeats 5 --seconds 45
    .venv/bin/python experiments/faults/kill_loop.py --repeats 1 --kills 5 --interval 0.5 --rounds 20  # the test's size
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import signal
import threading
import time

import torch

from fedsim.client import Client
from fedsim.client.federation import federate, make_clients
from fedsim.core.errors import WorkerStartupError
from fedsim.data.partition import natural
from fedsim.data.synthetic import synthetic
from fedsim.executor import Executor, ProcessExecutor, RayExecutor, SerialExecutor
from fedsim.models import MLP2NN
from fedsim.observe.run_logger import RunLogger
from fedsim.server import Federation, RoundFailedError, Schedule, Server


def build(executor, rounds: int) -> Server:  # type: ignore[no-untyped-def]
    data = federate(
        synthetic(num_devices=20, min_size=200, max_size=400, seed=3), natural, client_test_fraction=0.2, seed=0
    )
    return Server(
        model_factory=functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=64),
        federation=Federation(
            clients=make_clients(data, functools.partial(Client, epochs=2, batch_size=10)),
            train_data=data.train,
            test_data=data.test,
        ),
        strategy=__import__("fedsim.strategy", fromlist=["FedAvg"]).FedAvg(),
        executor=executor,
        schedule=Schedule(num_rounds=rounds, clients_per_round=6),
        seed=0,
        logger=RunLogger(None, tensorboard=False, progress=False),
    )


def kill_loop(
    executor: Executor,
    stop: threading.Event,
    interval: float,
    seconds: float,
    seed: int,
    kills: list[int],
    max_kills: int | None = None,
) -> None:
    """Every ``interval`` s, SIGKILL a random live worker (one being started included), for ``seconds`` or until
    ``max_kills`` were killed."""
    rng, deadline = random.Random(seed), time.monotonic() + seconds
    while not stop.wait(interval) and time.monotonic() < deadline and (max_kills is None or len(kills) < max_kills):
        pids = _ray_workers() if isinstance(executor, RayExecutor) else _process_workers(executor)
        if pids:
            pid = rng.choice(sorted(set(pids)))
            try:
                os.kill(pid, signal.SIGKILL)
                kills.append(pid)
            except ProcessLookupError:
                pass


def _process_workers(executor: ProcessExecutor) -> list[int]:
    """The run's workers and every process below this one: workers being started (forked by the forkserver, or
    spawned), the forkserver itself and multiprocessing's resource tracker."""
    return [w.process.pid for w in executor.workers if w.process.pid] + _descendants(os.getpid())


def _ray_workers() -> list[int]:
    """Pids of the worker processes of this script's own Ray (command lines ``ray::RayWorker...`` and
    ``ray::IDLE``; they descend from this process through its raylet): the actors, actors being started and
    idle pooled workers. Not Ray's agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``: the node dies
    with them), its daemons, this driver, or any other Ray on the machine."""
    found = []
    for pid in _descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if handle.read(14).startswith((b"ray::RayWorker", b"ray::IDLE")):
                    found.append(pid)
        except OSError:
            continue
    return found


def _descendants(pid: int) -> list[int]:
    """Pids of the live processes below ``pid`` (children, their children, ...)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:  # it exited meanwhile
            continue
        for thread in threads:
            try:
                with open(f"/proc/{parent}/task/{thread}/children") as handle:
                    children = [int(p) for p in handle.read().split()]
            except OSError:
                continue
            found.extend(children)
            todo.extend(children)
    return found


def one_repeat(
    kind: str,
    rounds: int,
    interval: float,
    seconds: float,
    seed: int,
    reference: torch.Tensor,
    max_kills: int | None = None,
) -> dict:
    if kind == "ray":
        executor: Executor = RayExecutor(workers=2, max_retries=10, start_timeout_s=60)
    else:
        executor = ProcessExecutor(devices="cpu", workers=2, max_retries=10, start_timeout_s=60)
    server, stop, kills = build(executor, rounds), threading.Event(), []
    killer = threading.Thread(
        target=kill_loop, args=(executor, stop, interval, seconds, seed, kills, max_kills), daemon=True
    )
    start = time.perf_counter()
    killer.start()
    try:
        result = server.run()
        outcome = "bitwise equal to serial" if torch.equal(result.params, reference) else "DIFFERENT from serial"
    except (RoundFailedError, WorkerStartupError) as error:
        outcome = f"stopped with one line: {str(error).splitlines()[0][:160]}"
    finally:
        stop.set()
        killer.join()
    return {
        "executor": kind,
        "seed": seed,
        "kills": len(kills),
        "seconds": round(time.perf_counter() - start, 1),
        "outcome": outcome,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument(
        "--kills", type=int, default=None, help="stop killing after this many kills (default: no limit)"
    )
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--executor", choices=("process", "ray"), default="process")
    args = parser.parse_args()
    reference = build(SerialExecutor(), args.rounds).run().params
    if args.executor == "ray":  # one local Ray for all repeats; each repeat's executor joins it
        import ray

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    for seed in range(args.repeats):
        line = one_repeat(args.executor, args.rounds, args.interval, args.seconds, seed, reference, args.kills)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
