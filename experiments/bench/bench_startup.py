"""Whole short runs from the command line: ``executor=serial`` against ``executor=process``, start-up and teardown.

Issue #15's targets: two process workers ready ≤ 1.0 s after the data is built (or fully overlapped with
building it), teardown ≤ 0.2 s, and a 5-round 2NN run with ``executor=process`` no slower end to end than with
``executor=serial``. Each repeat runs, in alternating order, one fresh ``python -m fedsim`` per executor::

    python -m fedsim model=mlp num_rounds=5 executor=<serial|process> logger.progress=false logger.tensorboard=false

(the default Synthetic(1,1) data, 30 devices, 10 per round) and records the command's wall time (interpreter
start to exit, imports included) and, for the process executor, the two lines it logs in ``run.log``: "N process
workers ready in S s" (from ``start()``, which the command calls once the data and model are built) and
"N process workers stopped in S s" (``close()``). Medians over ``--repeats``; ``--load N`` for a busy machine.

Run from the repository root::

    .venv/bin/python experiments/bench/bench_startup.py                # writes results_startup.json, ~1 minute
    .venv/bin/python experiments/bench/bench_startup.py --load 1       # writes results_startup_load1.json
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (reporting, --load)

EXECUTORS = ("serial", "process")
COMMAND = ["-m", "fedsim", "model=mlp", "num_rounds=5", "logger.progress=false", "logger.tensorboard=false"]
LOGGED = {
    "ready_s": re.compile(r"process workers ready in ([\d.]+) s"),
    "stopped_s": re.compile(r"process workers stopped in ([\d.]+) s"),
}


def run_once(executor: str, run_dir: Path) -> dict[str, Any]:
    """One ``python -m fedsim`` run: its wall time and what its run.log says about the workers."""
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *COMMAND, f"executor={executor}", f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        cwd=harness.HERE.parent.parent,
    )
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"executor={executor} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    log = (run_dir / "run.log").read_text()
    found = {key: pattern.search(log) for key, pattern in LOGGED.items()}
    accuracy = re.search(r"final test accuracy: ([\d.]+)", done.stdout + done.stderr)
    return {
        "wall_s": wall,
        **{k: float(m.group(1)) if m else None for k, m in found.items()},
        "final_accuracy": float(accuracy.group(1)) if accuracy else None,
    }


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    harness.add_common_args(p, repeats=("--repeats", 5, "runs per executor"), warmup=None)
    args = p.parse_args(argv)
    report = harness.new_report(args, harness.HERE / "results_startup.json")
    runs: dict[str, list[dict[str, Any]]] = {e: [] for e in EXECUTORS}
    with tempfile.TemporaryDirectory(prefix="fedsim-bench-startup-") as tmp, harness.busy_machine(args.load) as load:
        for repeat in range(args.repeats):
            for executor in EXECUTORS if repeat % 2 == 0 else EXECUTORS[::-1]:
                runs[executor].append(run_once(executor, Path(tmp) / f"{executor}{repeat}"))
                print(executor, {k: round(v, 3) for k, v in runs[executor][-1].items() if v is not None}, flush=True)
    summary = {e: {key: median_of(r, key) for key in ("wall_s", *LOGGED)} for e, r in runs.items()}
    summary["process_over_serial_wall"] = harness.ratio(summary["process"]["wall_s"], summary["serial"]["wall_s"])
    accuracies = {e: sorted({r["final_accuracy"] for r in rs}) for e, rs in runs.items()}
    print("medians:", summary, "\nfinal accuracies:", accuracies)
    report.update(runs=runs, medians=summary, final_accuracies=accuracies, load=load.record())
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
