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
    .venv/bin/python experiments/bench/parent_threads_ab.py --model 2nn --rounds 20 --load 1   # busy machine

The rounds are driven by ``harness.run_interleaved`` (one contender; the thread count is set in its untimed
``prepare``, before the quiet-second wait), on the workload of ``workload.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (timing, reporting, --load)
import workload as wl  # noqa: E402

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
        out[int(tid)] = (int(rest[11]) + int(rest[12])) / harness.CLOCK_TICKS
    return out


class AlternatingParent(wl.FedsimContender):
    """``ProcessExecutor(workers=2, threads=1)``; round 1 at torch's default, then A (default) / B (1 thread)."""

    def __init__(self, bench: wl.Bench, log_dir: Path, conditions: dict[str, int]) -> None:
        executor = ProcessExecutor(devices="cpu", workers=2, threads=1)
        super().__init__("process_w2", bench, executor, log_dir, server_threads=None)  # the A/B sets the threads
        self.conditions, self.default = conditions, torch.get_num_threads()
        self.per_thread: list[list[float]] = []

    def label(self, round_num: int) -> str | None:
        return None if round_num == 1 else ("A" if round_num % 2 == 0 else "B")

    def prepare(self, round_num: int) -> None:
        label = self.label(round_num)
        torch.set_num_threads(self.default if label is None else self.conditions[label])

    def run_round(self, round_num: int) -> None:
        before = thread_cpu_s()
        try:
            super().run_round(round_num)
        finally:
            after = thread_cpu_s()
            self.per_thread.append(sorted((after[t] - before.get(t, 0.0) for t in after), reverse=True))
            torch.set_num_threads(self.default)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", default="2nn", choices=sorted(wl.MODELS))
    wl.add_workload_args(p, models=None)
    harness.add_common_args(p, repeats=("--rounds", 20, "rounds after one warm-up round, alternating A/B"), warmup=None)
    args = p.parse_args(argv)
    out_given = args.out is not None
    args.warmup = 1
    data, shares = wl.mnist_clients(args)
    head = harness.new_report(args, harness.HERE / "parent_threads_ab.json")  # a file only with --out
    bench = wl.make_bench(args.model, data, shares, args)
    conditions = {"A": torch.get_num_threads(), "B": 1}
    rows: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as tmp:
        contender = AlternatingParent(bench, Path(tmp), conditions)
        with harness.busy_machine(args.load) as load:
            row = harness.run_interleaved([contender], bench.total_rounds, tag=args.model)["process_w2"]
        for round_num in range(2, bench.total_rounds + 1):
            i, per_thread = round_num - 1, contender.per_thread[round_num - 1]
            rows[contender.label(round_num)].append(
                {
                    "wall_s": row["round_s"][i],
                    "parent_cpu_s": sum(per_thread),
                    "parent_threads_busy": sum(c > 0 for c in per_thread),
                    "others_cores": row["others_cores"][i],
                    "load_cores": row["load_cores"][i],
                }
            )
        reference = wl.FedsimContender("serial_t1", bench, SerialExecutor(threads=1), Path(tmp))
        reference.start()
        for round_num in range(1, bench.total_rounds + 1):
            reference.run_round(round_num)
    same = torch.equal(row["params"], reference.info()["params"])
    print(
        f"{args.model}: ProcessExecutor(workers=2, threads=1), {len(shares[0])} examples/client, rounds alternate A/B"
    )
    print(
        f"{'parent threads':<22}{'rounds':>7}{'median wall s':>15}{'min wall s':>12}"
        f"{'median parent cpu s':>21}{'median others':>15}"
    )
    for label, threads in conditions.items():
        r = rows[label]
        med = lambda k, r=r: statistics.median(x[k] for x in r)  # noqa: E731
        print(
            f"{label} = {threads:<18}{len(r):>7}{med('wall_s'):>15.3f}{min(x['wall_s'] for x in r):>12.3f}"
            f"{med('parent_cpu_s'):>21.3f}{med('others_cores'):>15.2f}"
        )
    a, b = (statistics.median(x["wall_s"] for x in rows[k]) for k in "AB")
    print(f"A/B median wall ratio: {a / b:.2f}x; final weights equal to SerialExecutor(threads=1): {same}")
    if out_given:
        harness.write_json(
            args.out,
            {**head, "conditions": conditions, "rows": rows, "bitwise_equal_serial": same, "load": load.record()},
        )


if __name__ == "__main__":
    main()
