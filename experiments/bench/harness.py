"""The benchmarks' shared harness: measuring, the interleaved driver, result files, a busy machine.

``run_interleaved`` drives contenders (``name``, ``start()``, ``run_round(r)``, ``close()``, ``info()``; optional
``prepare(r)``, untimed, and ``synchronize()``, timed) under a ``Meter``: wall time, this process tree's CPU, the
cores OTHER processes and the load generator used. ``busy_machine(cores)`` (``--load N``) keeps N cores busy with
unpinned processes spinning on an integer loop while the benchmark measures, then stops them (errors and Ctrl-C
included; they also exit when the benchmark dies); the result file's ``load`` says what they used.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
QUIET = {"threshold_cores": 0.25, "max_wait_s": 5.0}  # set by ``new_report`` from --quiet-threshold / --quiet-wait
_LOAD_PIDS: set[int] = set()  # the load generator's live processes (once reaped, rusage counts them as ours)


def cpu_seconds() -> tuple[float, float, float]:
    """CPU seconds so far: the whole machine busy (/proc/stat: user+nice+system+irq+softirq+steal); this process
    and its descendants, alive (/proc) or reaped (rusage), the load generator excluded; the load generator."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    parent_of, cpu_of = {}, {}
    for pid in (int(e) for e in os.listdir("/proc") if e.isdigit()):
        try:
            rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parent_of[pid], cpu_of[pid] = int(rest[1]), (int(rest[11]) + int(rest[12])) / CLOCK_TICKS
    me, mine = os.getpid(), {os.getpid()}
    while len(grown := mine | {p for p, pp in parent_of.items() if pp in mine and p not in _LOAD_PIDS}) > len(mine):
        mine = grown
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime + sum(cpu_of[p] for p in mine if p != me)
    return sum(fields[i] for i in (0, 1, 2, 5, 6, 7)) / CLOCK_TICKS, ours, sum(cpu_of.get(p, 0.0) for p in _LOAD_PIDS)


class Meter:
    """Wall time of an interval, our CPU, the cores others used and the cores the load generator used."""

    def __init__(self) -> None:
        self.wall, (self.busy, self.own, self.load) = time.perf_counter(), cpu_seconds()

    def stop(self) -> tuple[float, float]:
        """Wall seconds and others' mean busy cores; sets ``own_cpu_s`` and ``load_cores``."""
        wall = max(time.perf_counter() - self.wall, 1e-9)
        busy, own, load = cpu_seconds()
        self.own_cpu_s, self.load_cores = own - self.own, (load - self.load) / wall
        return wall, max(busy - self.busy - self.own_cpu_s - (load - self.load), 0.0) / wall


def wait_for_quiet() -> float | None:
    """Wait (at most, and if, QUIET's ``max_wait_s``) for a 1 s window of others' load < its threshold; return it."""
    if QUIET["max_wait_s"] <= 0:
        return None
    deadline = time.monotonic() + QUIET["max_wait_s"]
    while True:
        meter = Meter()
        time.sleep(1.0)
        _, foreign = meter.stop()
        if foreign < QUIET["threshold_cores"] or time.monotonic() > deadline:
            return foreign


class Abandon(RuntimeError):
    """Raised by ``run_round`` to drop its contender from the remaining rounds (``fields`` go to its row)."""

    fields: dict[str, Any] = {}


def run_interleaved(
    contenders: list[Any], total_rounds: int, tag: str = "", rotate: bool = True
) -> dict[str, dict[str, Any]]:
    """Start every contender, then run round r (1..total_rounds) of each in turn, the order rotating every
    round (``rotate``), so that all of them meet the same stretch of background load; close them all."""
    keys = ("round_s", "own_cpu_s", "others_cores", "others_cores_before", "load_cores")
    rows: dict[str, dict[str, Any]] = {c.name: {k: [] for k in keys} for c in contenders}
    alive = list(contenders)
    try:
        for c in contenders:
            wait_for_quiet()
            start = time.perf_counter()
            c.start()
            rows[c.name]["startup_s"] = time.perf_counter() - start
        for round_num in range(1, total_rounds + 1):
            shift = (round_num - 1) % len(alive) if rotate and alive else 0
            for c in alive[shift:] + alive[:shift]:
                print(f"[{tag}] round {round_num} {c.name}", file=sys.stderr, flush=True)
                row = rows[c.name]
                if hasattr(c, "prepare"):
                    c.prepare(round_num)
                row["others_cores_before"].append(wait_for_quiet())
                meter = Meter()
                try:
                    c.run_round(round_num)
                except Abandon as error:
                    row.update(error=f"round {round_num}: {error}", **error.fields)
                    alive.remove(c)
                    continue
                if hasattr(c, "synchronize"):
                    c.synchronize()
                wall, foreign = meter.stop()
                for key, value in zip(
                    ("round_s", "own_cpu_s", "others_cores", "load_cores"),
                    (wall, meter.own_cpu_s, foreign, meter.load_cores),
                    strict=True,
                ):
                    row[key].append(value)
    finally:
        for c in contenders:
            c.close()
    for c in contenders:
        rows[c.name].update(c.info())
    return rows


def summarize(result: dict[str, Any], warmup: int) -> dict[str, Any]:
    """The row without ``params``, plus the median and min of the timed rounds and the load during them."""
    timed, others, cpu = (result.get(k, [])[warmup:] for k in ("round_s", "others_cores", "own_cpu_s"))
    load = result.get("load_cores", [])[warmup:]
    return {
        **{k: v for k, v in result.items() if k != "params"},
        "timed_round_s": timed,
        "median_round_s": statistics.median(timed) if timed else None,
        "min_round_s": min(timed, default=None),
        "max_others_cores": max(others, default=None),
        "median_cpu_s": statistics.median(cpu) if cpu else None,
        "median_load_cores": statistics.median(load) if load else None,
    }


def time_calls(owner: Any, method: str, record: Callable[[float], Any]) -> None:
    """Replace ``owner.method`` with a wrapper that passes the seconds of each call (also one that raises) to
    ``record``: how a benchmark times one step inside fedsim's round (an encoder, a privacy step)."""
    wrapped = getattr(owner, method)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return wrapped(*args, **kwargs)
        finally:
            record(time.perf_counter() - start)

    setattr(owner, method, timed)


def ratio(numerator: float | None, denominator: float | None) -> float | None:  # None where either is missing
    return numerator / denominator if numerator and denominator else None


def print_rows(title: str, rows: dict[str, dict[str, Any]], extra: tuple[tuple[str, str], ...] = ()) -> None:
    """The usual table: median s/round, CPU, start-up, others' cores (and ``extra`` columns: (header, key))."""
    print(
        f"\n== {title}\n{'contender':<15}{'median s/round':>16}{'cpu s/round':>13}{'startup s':>11}"
        + "".join(f"{h:>14}" for h, _ in extra)
        + f"{'others cores':>14}{'load cores':>12}  timed rounds (s)"
    )
    for name, row in rows.items():
        if row.get("median_round_s") is None:
            print(f"{name:<15}{'n/a':>16}  {row.get('error', '')}")
            continue
        print(
            f"{name:<15}{row['median_round_s']:>16.4f}{row['median_cpu_s']:>13.3f}{row.get('startup_s', 0.0):>11.2f}"
            + "".join(f"{row[k]:>14.2f}" for _, k in extra)
            + f"{row['max_others_cores'] or 0.0:>14.2f}{row['median_load_cores'] or 0.0:>12.2f}  "
            + ", ".join(f"{s:.4f}" for s in row["timed_round_s"])
        )


def code_version() -> dict[str, Any]:
    """The commit benchmarked and any uncommitted changes under fedsim/ (the tree is shared and moves)."""

    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", *cmd], cwd=HERE, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty_fedsim_files": git("status", "--porcelain", "--", ":/fedsim").splitlines(),
    }


def machine() -> dict[str, Any]:
    """CPU model, cores, Python, torch and its default thread count."""
    import torch

    from fedsim.executor.placement import physical_cores

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "physical_cores": physical_cores(),
        "gpu": torch.cuda.is_available(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_default_threads": torch.get_num_threads(),
        "platform": platform.platform(),
    }


def add_common_args(
    p: argparse.ArgumentParser, *, repeats: tuple[str, int, str], warmup: int | None = 1, quiet_wait: float = 5.0
) -> None:
    """The repeats (flag, default, help), --warmup (unless None), --load, --quiet-threshold, --quiet-wait, --out."""
    p.add_argument(repeats[0], type=int, default=repeats[1], help=repeats[2])
    if warmup is not None:
        p.add_argument("--warmup", type=int, default=warmup, help="untimed warm-up rounds before them")
    p.add_argument(
        "--load",
        type=float,
        default=0.0,
        help="busy machine: keep this many cores busy with a load "
        "generator while measuring (default 0; results go to *_load<N>.json unless --out is given)",
    )
    p.add_argument(
        "--quiet-threshold", type=float, default=0.25, help="a round starts once others use fewer cores for 1 s ..."
    )
    p.add_argument(
        "--quiet-wait", type=float, default=quiet_wait, help="... or after waiting this many seconds (0: no wait)"
    )
    p.add_argument("--out", type=Path, default=None, help="result JSON (default: next to this script)")


def new_report(args: argparse.Namespace, default_out: Path, **machine_extra: Any) -> dict[str, Any]:
    """Set QUIET and ``args.out`` (default: ``<stem>_load<N>.json`` under load); the head of every result file."""
    QUIET.update(threshold_cores=args.quiet_threshold, max_wait_s=args.quiet_wait)
    if args.out is None:
        args.out = default_out.with_name(f"{default_out.stem}_load{args.load:g}.json") if args.load else default_out
    return {
        "machine": {**machine(), **machine_extra},
        "code": code_version(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "load": Load(0.0).record(),
    }


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"\nwrote {path}")


_SPIN = """import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C: exit quietly; the benchmark reaps us
parent, duty, x = int(sys.argv[1]), float(sys.argv[2]), 1
while os.getppid() == parent:  # the benchmark died without stopping us: stop
    end = time.perf_counter() + duty * 0.1
    while time.perf_counter() < end:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF
    time.sleep((1 - duty) * 0.1)
"""


class Load:
    """The load generator's processes: what was asked (``cores``) and, once stopped, what they consumed."""

    def __init__(self, cores: float) -> None:
        self.cores, self.procs, self.started = cores, [], time.perf_counter()
        self.wall_s: float | None = None  # set when stopped, with cpu_s
        self.cpu_s: float | None = None

    def record(self) -> dict[str, Any]:
        """For the result file (while it runs: the CPU so far)."""
        if not self.procs:
            return {"on": False, "requested_cores": self.cores}
        wall = self.wall_s if self.wall_s is not None else time.perf_counter() - self.started
        cpu = self.cpu_s if self.cpu_s is not None else cpu_seconds()[2]
        return {
            "on": True,
            "requested_cores": self.cores,
            "processes": len(self.procs),
            "pinned": False,
            "wall_s": wall,
            "cpu_s": cpu,
            "mean_cores": cpu / max(wall, 1e-9),
            "stopped": self.cpu_s is not None,
        }


@contextlib.contextmanager
def busy_machine(cores: float) -> Iterator[Load]:
    """Keep ``cores`` cores busy during the block (0: nothing), then stop and reap the load, whatever happens."""
    load = Load(cores)
    try:
        for duty in [1.0] * int(cores) + ([cores % 1] if cores % 1 > 1e-3 else []):
            load.procs.append(subprocess.Popen([sys.executable, "-c", _SPIN, str(os.getpid()), str(duty)]))
            _LOAD_PIDS.add(load.procs[-1].pid)
        if load.procs:
            print(
                f"busy machine: {cores:g} cores, load pids {[p.pid for p in load.procs]}", file=sys.stderr, flush=True
            )
        yield load
    finally:
        load.cpu_s, load.wall_s = cpu_seconds()[2], time.perf_counter() - load.started
        for proc in load.procs:
            proc.terminate()
        for proc in load.procs:
            proc.wait()  # SIGTERM's default action: the spinner cannot ignore it
        _LOAD_PIDS.difference_update(p.pid for p in load.procs)
        if load.procs:
            print(
                f"busy machine: stopped; the load used {load.cpu_s:.1f} CPU s in {load.wall_s:.1f} s", file=sys.stderr
            )
