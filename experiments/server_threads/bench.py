"""The server's thread budget (``server_threads``), side by side: 1 thread against torch's default.

Runs the same process-executor run (2NN on Synthetic(1,1), 100 devices, 10 per round, 2 workers) with
``server_threads=1`` and ``server_threads=null`` (one thread per core), interleaved, on a quiet machine and
with a background process spinning on one core. Prints the median round time of each (rounds 3.. of each
run), their ratio, and whether the final weights are bitwise equal. One JSON line per condition.

    .venv/bin/python experiments/server_threads/bench.py --repeats 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import statistics
import time

from fedsim.run import compose, run_config

OVERRIDES = [
    "model=mlp",
    "executor=process",
    "executor.devices=cpu",
    "executor.workers=2",
    "num_rounds=10",
    "logger=quiet",
    "data.num_devices=100",
    "clients_per_round=10",
]


def _spin(stop: mp.synchronize.Event) -> None:
    """Keep one core busy until ``stop`` is set (another job on the machine)."""
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def _one(threads: str) -> tuple[float, str]:
    result = run_config(compose([*OVERRIDES, f"server_threads={threads}"]))
    rounds = [r["time/round_s"] for r in result.history][2:]
    return statistics.median(rounds), hashlib.sha256(result.params.numpy().tobytes()).hexdigest()[:16]


def measure(repeats: int, loaded: bool) -> dict:
    stop, spinner = mp.Event(), None
    if loaded:
        spinner = mp.Process(target=_spin, args=(stop,), daemon=True)
        spinner.start()
        time.sleep(1.0)
    try:
        times: dict[str, list[float]] = {"1": [], "null": []}
        digests = set()
        for _ in range(repeats):
            for threads in ("1", "null"):
                median, digest = _one(threads)
                times[threads].append(median)
                digests.add(digest)
    finally:
        stop.set()
        if spinner is not None:
            spinner.join()
    one, default = statistics.median(times["1"]), statistics.median(times["null"])
    return {
        "load": "one core busy" if loaded else "quiet",
        "round_s_server_threads_1": round(one, 4),
        "round_s_torch_default": round(default, 4),
        "default / 1": round(default / one, 2),
        "weights bitwise equal": len(digests) == 1,
        "repeats": repeats,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for loaded in (False, True):
        print(json.dumps(measure(args.repeats, loaded)), flush=True)


if __name__ == "__main__":
    main()
