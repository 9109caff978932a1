"""Does a Hydra multirun (many jobs in one Python process) leak memory, fds, threads or workers?

Runs ``python -m fedsim -m seed=range(0,N) ...`` once per executor with the :mod:`probe` callback, which
samples the launcher process after every job, then prints first/last samples and the per-job RSS slope.
Usage (from the repository root): ``.venv/bin/python experiments/multirun_memory/measure.py``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
COUNTS = (
    "fds",
    "threads",
    "children",
    "Server",
    "RunLogger",
    "SummaryWriter",
    "ProcessExecutor",
    "FileHandler",
    "root_handlers",
)


def run_sweep(
    executor: str, jobs: int, rounds: int, out_dir: Path, probe: list[str], overrides: list[str]
) -> tuple[list[dict[str, Any]], float]:
    """One multirun of ``jobs`` seeds in one process; returns the probe's samples and the wall time."""
    samples = out_dir / f"{executor}.jsonl"
    extra = ["executor.devices=cpu", "executor.workers=2"] if executor == "process" else []
    cmd = [
        sys.executable,
        "-m",
        "fedsim",
        "-m",
        f"seed=range(0,{jobs})",
        f"num_rounds={rounds}",
        f"executor={executor}",
        *extra,
        "logger.progress=False",
        *overrides,
        f"hydra.sweep.dir={out_dir / executor}",
        "+hydra.callbacks.probe._target_=probe.Probe",
        f"+hydra.callbacks.probe.out={samples}",
        *probe,
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"sweep failed ({executor}):\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in samples.read_text().splitlines()], time.perf_counter() - start


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``ys`` over ``xs``."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def summarize(samples: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """RSS after the warm-up jobs and after the last one, the slope over the jobs after warm-up, the counts."""
    jobs = [s for s in samples if s["job"] >= warmup]
    first, last = jobs[0], jobs[-1]
    xs = [float(s["job"]) for s in jobs]
    return {
        "before_first_job": {k: samples[0][k] for k in ("rss_kib", *COUNTS)},
        "after_warmup": {k: first[k] for k in ("job", "rss_kib", "rss_anon_kib", "gc_objects", *COUNTS)},
        "after_last": {k: last[k] for k in ("job", "rss_kib", "rss_anon_kib", "gc_objects", *COUNTS)},
        "rss_kib_per_job": slope(xs, [float(s["rss_kib"]) for s in jobs]),
        "rss_anon_kib_per_job": slope(xs, [float(s["rss_anon_kib"]) for s in jobs]),
        "gc_objects_per_job": slope(xs, [float(s["gc_objects"]) for s in jobs]),
        **(
            {"rss_trimmed_kib_per_job": slope(xs, [float(s["rss_trimmed_kib"]) for s in jobs])}
            if "rss_trimmed_kib" in last
            else {}
        ),
        **({"traced_heap_growth": last["traced_growth"]} if "traced_growth" in last else {}),
        "max": {k: max(s[k] for s in jobs) for k in ("fds", "threads", "children", "Server", "RunLogger")},
    }


def type_growth(samples: list[dict[str, Any]], warmup: int, top: int = 12) -> list[tuple[str, int]]:
    """Types whose live count grew most between the first job after warm-up and the last."""
    first = next(s for s in samples if s["job"] == warmup)["types"]
    last = samples[-1]["types"]
    growth = Counter({k: last.get(k, 0) - first.get(k, 0) for k in set(first) | set(last)})
    return [(k, n) for k, n in growth.most_common(top) if n > 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serial-jobs", type=int, default=30)
    parser.add_argument("--process-jobs", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3, help="jobs left out of the slope (imports, first allocations)")
    parser.add_argument("--types", action="store_true", help="also attribute the growth of live objects by type")
    parser.add_argument("--trim", action="store_true", help="also sample the RSS after malloc_trim(0)")
    parser.add_argument(
        "--trace", action="store_true", help="trace Python allocations from the first job after warm-up"
    )
    parser.add_argument("overrides", nargs="*", help="more fedsim overrides for every job, e.g. logger=quiet")
    parser.add_argument("--out", type=Path, default=HERE / "results.json")
    args = parser.parse_args()
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    probe = [
        f"+hydra.callbacks.probe.types={str(args.types).lower()}",
        f"+hydra.callbacks.probe.trim={str(args.trim).lower()}",
        f"+hydra.callbacks.probe.trace_from={args.warmup if args.trace else -1}",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for executor, jobs in (("serial", args.serial_jobs), ("process", args.process_jobs)):
            if jobs <= args.warmup:
                continue
            samples, wall = run_sweep(executor, jobs, args.rounds, Path(tmp), probe, args.overrides)
            result = {
                "jobs": jobs,
                "wall_s": round(wall, 1),
                **summarize(samples, args.warmup),
                "samples": [{k: v for k, v in s.items() if k not in ("types", "traced_growth")} for s in samples],
            }
            if args.types:
                result["type_growth"] = type_growth(samples, args.warmup)
            results[executor] = result
            print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
