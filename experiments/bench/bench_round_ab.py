"""Per-round cost of this checkout against another commit, interleaved: does a change to the round cost time?

    .venv/bin/python experiments/bench/bench_round_ab.py --against 742a467 [--repeats 5] [--rounds 40]

Each contender is a source tree (this checkout, and ``--against`` checked out into a temporary git worktree) run
with the same interpreter. For each executor (serial; process with 2 workers) and each repeat, both trees run the
default experiment in fresh subprocesses, in alternating order: a run of ``--rounds`` rounds and a run of 1 round,
each timed around ``Server.run()`` only (the build is not timed). The per-round cost of a tree is
(T(rounds) − T(1)) / (rounds − 1), which removes what does not depend on the number of rounds (worker start-up,
the final checkpoint). The ratio is this checkout's over the other's, per repeat; the script prints the median and
the range and writes ``results_round_ab.json`` beside itself. Both trees must end with the same final weights
(checked: results are bitwise those of the other commit, or the comparison is meaningless).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CHILD = """
import json, sys, time
from fedsim.cli.run import build_server, compose
server = build_server(compose(sys.argv[1:]))
start = time.perf_counter()
result = server.run()
print(json.dumps({"run_s": time.perf_counter() - start, "sum": float(result.params.double().sum())}))
"""
EXECUTORS = {
    "serial": ["executor=serial"],
    "process": ["executor=process", "executor.devices=cpu", "executor.workers=2"],
}


def timed_run(tree: Path, overrides: list[str]) -> dict[str, float]:
    """One run of the default experiment from ``tree``'s sources in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, "logger=quiet", *overrides],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=1200,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def per_round(tree: Path, executor: list[str], rounds: int) -> tuple[float, float]:
    """(seconds per round, the final weights' sum) of ``tree``."""
    long = timed_run(tree, [*executor, f"num_rounds={rounds}"])
    short = timed_run(tree, [*executor, "num_rounds=1"])
    return (long["run_s"] - short["run_s"]) / (rounds - 1), long["sum"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", required=True, help="the commit to compare with (e.g. 742a467)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=40)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "other"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(other), args.against], check=True)
        try:
            results = compare(REPO, other, args.repeats, args.rounds)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(other)], check=False)
    results["against"], results["rounds"] = args.against, args.rounds
    (HERE / "results_round_ab.json").write_text(json.dumps(results, indent=2) + "\n")


def compare(here: Path, other: Path, repeats: int, rounds: int) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, executor in EXECUTORS.items():
        ratios, sums = [], set()
        for repeat in range(repeats):
            order = [here, other] if repeat % 2 == 0 else [other, here]
            timings = {}
            for tree in order:
                timings[tree], total = per_round(tree, executor, rounds)
                sums.add(total)
            ratios.append(timings[here] / timings[other])
            print(
                f"{name} repeat {repeat}: this {timings[here] * 1e3:.1f} ms/round, other {timings[other] * 1e3:.1f}, "
                f"ratio {ratios[-1]:.3f}",
                flush=True,
            )
        assert len(sums) == 1, f"{name}: the two trees end with different weights ({sums})"
        out[name] = {"ratios": ratios, "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
        print(
            f"{name}: this / other per round = {statistics.median(ratios):.3f} "
            f"(range {min(ratios):.3f}-{max(ratios):.3f}, {repeats} interleaved repeats)",
            flush=True,
        )
    return out


if __name__ == "__main__":
    main()
