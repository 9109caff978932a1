"""From a fresh ``python -m fedsim`` to the end of round 1: ``executor=serial`` against ``process`` (and ``auto``).

Issue #44's target: on an idle 2-core machine ``executor=process`` reaches the end of round 1 within 1 s of serial on
``experiment=lora_tiny`` and within 0.5 s on the default experiment. Each repeat runs, per experiment, one fresh
``python -m fedsim <experiment> executor=<e> logger.progress=false logger.tensorboard=false`` per executor, the
executors' order rotating from repeat to repeat, and records:

* ``round1_s``: from just before the process is started to the timestamp of the first ``round 1: ...`` line of its
  ``run.log`` (logged once round 1 has trained, been aggregated and evaluated, right after ``metrics.jsonl``'s first
  record is written; millisecond resolution);
* ``wall_s``: from start to exit (imports, all rounds, teardown);
* ``ready_s``: the process executor's "N process workers ready in S s" (from ``start()``);
* ``others_cores``: the cores other processes used during the run (``harness.Meter``); ``others_cores_before``:
  just before it, after waiting up to ``--quiet-wait`` s for them to fall below ``--quiet-threshold``.

Medians over ``--repeats``, and the median of the per-repeat differences (process − serial). ``--load N`` keeps N
cores busy meanwhile. Run from the repository root::

    .venv/bin/python experiments/bench/bench_round1.py                      # results_round1.json, ~4 min idle
    .venv/bin/python experiments/bench/bench_round1.py --load 1             # results_round1_load1.json
    .venv/bin/python experiments/bench/bench_round1.py --executors serial,process,auto --experiments default
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (reporting, --load, the cores others used)

EXPERIMENTS = {"default": [], "lora_tiny": ["experiment=lora_tiny"]}
COMMON = ["logger.progress=false", "logger.tensorboard=false"]
ROUND1 = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[fedsim\]\[INFO\] - round 1: ", re.M)
READY = re.compile(r"process workers ready in ([\d.]+) s")
CHOICE = re.compile(r"executor=auto: (\w+)")


def run_once(experiment: str, executor: str, run_dir: Path, extra: list[str]) -> dict[str, Any]:
    """One fresh ``python -m fedsim``: seconds to the end of round 1 and to its exit, and what its run.log says."""
    command = [sys.executable, "-m", "fedsim", *EXPERIMENTS[experiment], *COMMON, *extra]
    quiet = harness.wait_for_quiet()  # up to --quiet-wait s for the others' load to drop below --quiet-threshold
    meter, began = harness.Meter(), time.time()
    done = subprocess.run(
        [*command, f"executor={executor}", f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        cwd=harness.HERE.parent.parent,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    wall, others = meter.stop()
    if done.returncode != 0:
        raise RuntimeError(f"{experiment} executor={executor} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    log = (run_dir / "run.log").read_text()
    stamp = ROUND1.search(log)
    if stamp is None:
        raise RuntimeError(f"{run_dir}/run.log has no 'round 1:' line")
    logged = datetime.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    ready, choice = READY.search(log), CHOICE.search(log)
    return {
        "round1_s": logged - began,
        "wall_s": wall,
        "ready_s": float(ready.group(1)) if ready else None,
        "auto_choice": choice.group(1) if choice else None,
        "cpu_s": meter.own_cpu_s,
        "others_cores": others,
        "others_cores_before": quiet,
    }


def summarize(runs: dict[str, list[dict[str, Any]]], baseline: str = "serial") -> dict[str, Any]:
    """Medians per executor, and the median of each executor's per-repeat differences from ``baseline``."""
    out: dict[str, Any] = {}
    for executor, rows in runs.items():
        medians = {k: statistics.median(r[k] for r in rows) for k in ("round1_s", "wall_s", "cpu_s", "others_cores")}
        ready = [r["ready_s"] for r in rows if r["ready_s"] is not None]
        medians["ready_s"] = statistics.median(ready) if ready else None
        if executor != baseline and baseline in runs:
            for key in ("round1_s", "wall_s"):
                diffs = [r[key] - b[key] for r, b in zip(rows, runs[baseline], strict=True)]
                medians[f"{key}_minus_{baseline}"] = statistics.median(diffs)
                medians[f"{key}_minus_{baseline}_all"] = diffs
        out[executor] = medians
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    harness.add_common_args(p, repeats=("--repeats", 5, "runs per experiment and executor"), warmup=None)
    p.add_argument("--experiments", default=",".join(EXPERIMENTS), help="comma-separated: " + ",".join(EXPERIMENTS))
    p.add_argument("--executors", default="serial,process", help="comma-separated executor options (serial first)")
    p.add_argument("--rounds", type=int, default=None, help="num_rounds for every run (default: the experiment's)")
    args = p.parse_args(argv)
    report = harness.new_report(args, harness.HERE / "results_round1.json")
    executors, experiments = args.executors.split(","), args.experiments.split(",")
    extra = [] if args.rounds is None else [f"num_rounds={args.rounds}"]
    runs = {x: {e: [] for e in executors} for x in experiments}
    with tempfile.TemporaryDirectory(prefix="fedsim-bench-round1-") as tmp, harness.busy_machine(args.load) as load:
        for repeat in range(args.repeats):
            for experiment in experiments:
                shift = repeat % len(executors)
                for executor in executors[shift:] + executors[:shift]:
                    row = run_once(experiment, executor, Path(tmp) / f"{experiment}-{executor}-{repeat}", extra)
                    runs[experiment][executor].append(row)
                    print(experiment, executor, {k: v for k, v in row.items() if v is not None}, flush=True)
    report.update(runs=runs, medians={x: summarize(r) for x, r in runs.items()}, load=load.record())
    for experiment, medians in report["medians"].items():
        for executor, m in medians.items():
            diff = m.get("round1_s_minus_serial")
            print(
                f"{experiment:<10} {executor:<8} round 1 at {m['round1_s']:.2f} s"
                + ("" if diff is None else f" ({diff:+.2f} s vs serial)")
                + f", exit {m['wall_s']:.2f} s, others {m['others_cores']:.2f} cores"
            )
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
