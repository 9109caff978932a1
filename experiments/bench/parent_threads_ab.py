"""A/B: does the server process's own intra-op thread pool slow down a ProcessExecutor round?

ProcessExecutor's workers use ``threads`` (1) intra-op threads each and, by default, one worker per
core, so the workers alone fill the machine. The parent process keeps torch's default thread count
(all cores). Every tensor operation it runs during a round (copying each result out of its shared
buffer, the server's checks and aggregation) opens an OpenMP parallel region whose threads then
compete with the workers for the same cores.

This script runs ONE ``Server`` + ``ProcessExecutor(devices="cpu", workers=2, threads=1)`` and
alternates, round by round (A B A B ...), the parent's ``torch.set_num_threads`` between torch's
default and 1. The workers, data and rounds are the same; only the parent's thread count differs.
It reports the wall time of each round and the CPU seconds each of the parent's threads used in it
(from /proc/self/task). The weights do not depend on the parent's thread count (its math is
element-wise), which the script checks against a SerialExecutor(threads=1) run.

Run from the repository root::

    .venv/bin/python experiments/bench/parent_threads_ab.py --model 2nn --rounds 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_executors as bench_mod  # noqa: E402

from fedsim import SerialExecutor  # noqa: E402
from fedsim.executor import ProcessExecutor  # noqa: E402


def thread_cpu_s() -> dict[int, float]:
    """CPU seconds of each thread of this process so far."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            rest = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(rest[11]) + int(rest[12])) / bench_mod.CLOCK_TICKS
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", default="2nn", choices=sorted(bench_mod.MODELS))
    p.add_argument("--rounds", type=int, default=20, help="rounds after one warm-up round, alternating A/B")
    p.add_argument("--examples-per-client", type=int, default=None)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    bargs = bench_mod.parse_args(["--rounds", str(args.rounds), "--warmup", "1"])
    data = bench_mod.mnist_shaped(bargs.num_examples, bargs.seed)
    shares = bench_mod.iid(data.labels, num_clients=bargs.clients, seed=bargs.seed)
    if args.examples_per_client:
        shares = [s[: args.examples_per_client] for s in shares]
    bench = bench_mod.make_bench(args.model, data, shares, bargs)
    default_threads = torch.get_num_threads()
    conditions = {"A": default_threads, "B": 1}
    rows: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as tmp:
        contender = bench_mod.FedsimContender("process_w2", bench, ProcessExecutor(devices="cpu", workers=2, threads=1), Path(tmp))
        contender.start()
        try:
            contender.run_round(1)
            for round_num in range(2, bench.total_rounds + 1):
                label = "A" if round_num % 2 == 0 else "B"
                torch.set_num_threads(conditions[label])
                bench_mod.wait_for_quiet()
                before, meter = thread_cpu_s(), bench_mod.Meter()
                contender.run_round(round_num)
                wall, others = meter.stop()
                after = thread_cpu_s()
                per_thread = sorted((after[t] - before.get(t, 0.0) for t in after), reverse=True)
                rows[label].append({"wall_s": wall, "parent_cpu_s": sum(per_thread), "parent_threads_busy": sum(c > 0 for c in per_thread),
                                    "others_cores": others})
                torch.set_num_threads(default_threads)
        finally:
            contender.close()
        reference = bench_mod.FedsimContender("serial_t1", bench, SerialExecutor(threads=1), Path(tmp))
        reference.start()
        for round_num in range(1, bench.total_rounds + 1):
            reference.run_round(round_num)
    same = torch.equal(contender.info()["params"], reference.info()["params"])
    print(f"{args.model}: ProcessExecutor(workers=2, threads=1), {len(shares[0])} examples/client, rounds alternate A/B")
    print(f"{'parent threads':<22}{'rounds':>7}{'median wall s':>15}{'min wall s':>12}{'median parent cpu s':>21}{'median others':>15}")
    for label, threads in conditions.items():
        r = rows[label]
        med = lambda k: statistics.median(x[k] for x in r)  # noqa: E731
        print(f"{label} = {threads:<18}{len(r):>7}{med('wall_s'):>15.3f}{min(x['wall_s'] for x in r):>12.3f}"
              f"{med('parent_cpu_s'):>21.3f}{med('others_cores'):>15.2f}")
    a, b = (statistics.median(x["wall_s"] for x in rows[k]) for k in "AB")
    print(f"A/B median wall ratio: {a / b:.2f}x; final weights equal to SerialExecutor(threads=1): {same}")
    if args.out:
        args.out.write_text(json.dumps({"conditions": conditions, "rows": rows, "bitwise_equal_serial": same}, indent=2) + "\n")


if __name__ == "__main__":
    main()
