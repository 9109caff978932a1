"""Reading a sweep's run directories back (for :mod:`fedsim.report`): ``metrics.jsonl``, ``summary.json``
and Hydra's ``.hydra/`` files of every run, finished, unfinished or failed. Files only; no Hydra, no torch.

A line of ``metrics.jsonl`` is used when it is a round record as fedsim writes it (:func:`is_round_record`); any
other non-blank line is skipped and makes the file damaged (:func:`scan_metrics`, :attr:`Run.skipped`). A run whose
process still holds its directory's lock (``.fedsim.lock``, :func:`is_running`) is running: neither unfinished nor
damaged (its last line may be half written)."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

try:
    import fcntl
except ImportError:  # Windows: runs do not lock their directories there
    fcntl = None  # type: ignore[assignment]  # (absent on Windows; is_running checks for None)

Series = tuple[tuple[int, float], ...]  # (round, value) of the rounds that logged a scalar
SIM_TIME = "sim/time_s"  # the simulated clock at the end of a round (clock=sampled|trace; docs/system-heterogeneity.md)
COMM_MB = "comm/mb_total"  # megabytes (10^6 bytes) sent both ways by the end of a round (fedsim.server.exchange)
EPSILON = "dp/epsilon"  # the privacy budget spent by the end of a round, at dp.delta (dp=central|adaptive)
CUMULATIVE = {"sim_time": SIM_TIME, "comm_mb": COMM_MB, "epsilon": EPSILON}  # x axes: a running total per round
AGGREGATES = ("last", "mean", "sum", "max", "min")  # --metric NAME:AGG, over the rounds that logged NAME


@dataclass(frozen=True)
class Run:
    """One run directory, read back. ``curve`` holds ``(round, eval/accuracy)`` for evaluated rounds;
    ``finals`` every scalar's value in the last round that logged it (NaN where that was ``null``);
    ``series`` the ``(round, value)`` pairs of the scalars asked for (see :func:`load_run`); ``sim_time`` the
    ``(round, sim/time_s)`` pairs of a run on the simulated clock (finite values only; empty without a clock);
    ``comm_mb`` the ``(round, comm/mb_total)`` pairs (finite values only; empty for a run written before fedsim
    counted bytes); ``epsilon`` the ``(round, dp/epsilon)`` pairs of a run with differential privacy (finite values
    only; empty without DP)."""

    path: Path
    config: tuple[str, ...]  # sorted overrides without seed
    seed: str | None
    rounds: int  # last round logged
    curve: tuple[tuple[int, float], ...]
    finished: bool  # ended for good (see _finished)
    wall_time_s: float
    finals: dict[str, float] = field(default_factory=dict, hash=False)
    stop_reason: str | None = None  # summary.json's: "completed", "early stop: ...", "error: <one line>", ...
    series: dict[str, Series] = field(default_factory=dict, hash=False)
    sim_time: Series = ()
    comm_mb: Series = ()
    skipped: tuple[tuple[int, str], ...] = ()  # (line number, why) of each line of metrics.jsonl left out
    lines: int = 0  # non-blank lines of metrics.jsonl
    uncounted: str | None = None  # why a damaged run that summary.json calls finished is not counted as finished
    epsilon: Series = ()
    running: bool = False  # its process holds the directory's lock: still being written

    @property
    def failed(self) -> bool:
        """Stopped by an error (``summary.json``'s ``stop_reason`` is ``"error: ..."``)."""
        return self.stop_reason is not None and self.stop_reason.startswith("error:")

    @property
    def damaged(self) -> bool:
        """``metrics.jsonl`` holds lines that are not round records (see :func:`scan_metrics`), and the run is not
        running (a running run's last line may be half written)."""
        return bool(self.skipped) and not self.running


def is_running(run_dir: Path) -> bool:
    """Whether a live process holds ``run_dir``'s lock file (``.fedsim.lock``, taken by every fedsim run for as long
    as it writes the directory: fedsim.core.run_lock). A shared, non-blocking probe, released at once; a run that
    asks for the lock at that instant retries. (The same probe as fedsim.core.run_lock.is_held: the report imports
    nothing of the training side.)"""
    if fcntl is None:
        return False
    try:
        fd = os.open(run_dir / ".fedsim.lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


RUN_FILES = ("metrics.jsonl", "summary.json")  # a directory holding either is a run (a job that failed
#                                                before its first round may have summary.json alone)


def find_run_dirs(root: Path) -> list[Path]:
    """Every directory at or under ``root`` holding ``metrics.jsonl`` or ``summary.json``, in job order
    (``2_`` before ``10_``)."""
    if not root.is_dir():
        return []
    found = {p.parent for name in RUN_FILES for p in root.rglob(name)}
    return sorted(found, key=lambda p: _natural(str(p.relative_to(root))))


def _natural(text: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


CUT = "cut short"  # the file's last line, without its newline and not JSON: a write that did not end
NOT_JSON = "not JSON"
NOT_RECORD = "not a round record"  # JSON, but not what fedsim writes (see is_round_record)


@dataclass(frozen=True)
class MetricsFile:
    """What :func:`scan_metrics` read: the round records in file order, ``(line number, why)`` of each line left
    out (``why`` is :data:`CUT`, :data:`NOT_JSON` or :data:`NOT_RECORD`) and the number of non-blank lines."""

    records: list[dict[str, Any]]
    skipped: tuple[tuple[int, str], ...] = ()
    lines: int = 0


def is_round_record(record: Any) -> bool:
    """A line as :class:`fedsim.observe.run_logger.RunLogger` writes it: a JSON object whose ``round`` is a
    non-negative integer and whose other fields are numbers or ``null`` (a NaN or infinite value), but for
    ``clients``, the round's client rows: a list of objects, each with an integer ``client_id``."""
    if not isinstance(record, dict) or not _is_int(record.get("round")) or record["round"] < 0:
        return False
    for name, value in record.items():
        if name == "clients":
            if not isinstance(value, list) or not all(
                isinstance(r, dict) and _is_int(r.get("client_id")) for r in value
            ):
                return False
        elif name != "round" and value is not None and not _is_number(value):
            return False
    return True


def scan_metrics(path: Path) -> MetricsFile:
    """The round records of a ``metrics.jsonl`` (:func:`is_round_record`) and the lines left out: the last line
    cut short (no newline at its end and not JSON: a run killed while writing, or still being written), a line
    that is not JSON (or not UTF-8), a JSON line that is not a round record. Blank lines are passed over; a
    missing file has no lines."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return MetricsFile([])
    records: list[dict[str, Any]] = []
    skipped: list[tuple[int, str]] = []
    lines = data.split(b"\n")  # after a final newline: b"", passed over as blank
    count = 0
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        count += 1
        try:
            record = json.loads(raw.decode("utf-8"))
        except ValueError:  # JSONDecodeError and UnicodeDecodeError both are
            skipped.append((number, CUT if number == len(lines) else NOT_JSON))
            continue
        if is_round_record(record):
            records.append(record)
        else:
            skipped.append((number, NOT_RECORD))
    return MetricsFile(records, tuple(skipped), count)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The round records of a ``metrics.jsonl`` (see :func:`scan_metrics`); a missing file has none."""
    return scan_metrics(path).records


def _read(path: Path, load: Callable[[str], Any]) -> Any:
    """``load`` of the file's text; ``None`` if it is missing or unreadable."""
    try:
        return load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):  # JSONDecodeError is a ValueError
        return None


def split_seed(overrides: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
    """Sorted overrides without ``seed`` (also ``+seed``/``++seed``), and the seed's value if given."""
    rest, seed = [], None
    for item in overrides:
        key, _, value = str(item).partition("=")
        if key.lstrip("+~") == "seed":
            seed = value
        else:
            rest.append(str(item))
    return tuple(sorted(rest)), seed


def run_overrides(run_dir: Path, root: Path) -> list[str]:
    """The run's Hydra overrides; without ``.hydra/overrides.yaml``, parsed from a sweep subdir name
    (``3_seed=1,strategy=fedprox``); a name without ``=`` (a timestamp) stands for itself."""
    overrides = _read(run_dir / ".hydra" / "overrides.yaml", yaml.safe_load)
    if isinstance(overrides, list):
        return [str(o) for o in overrides]
    name = re.sub(r"^\d+_", "", run_dir.name)
    if "=" in name:
        return name.split(",")
    return [str(run_dir.relative_to(root)) if run_dir != root else run_dir.name]


def load_run(run_dir: Path, root: Path, series: Sequence[str] = ()) -> Run:
    """Read one run directory (``metrics.jsonl`` and ``summary.json``, either may be missing, and ``.hydra/``);
    keep the per-round values of the scalars named in ``series``."""
    scanned = scan_metrics(run_dir / "metrics.jsonl")
    records = scanned.records
    config, seed = split_seed(run_overrides(run_dir, root))
    hydra_cfg = _read(run_dir / ".hydra" / "config.yaml", yaml.safe_load)
    hydra_cfg = hydra_cfg if isinstance(hydra_cfg, dict) else {}
    if seed is None and "seed" in hydra_cfg:
        seed = str(hydra_cfg["seed"])
    summary = _read(run_dir / "summary.json", json.loads)
    summary = summary if isinstance(summary, dict) else None
    rounds = max((int(r["round"]) for r in records), default=0) or _int(summary.get("rounds") if summary else None)
    finished = _finished(summary, rounds, hydra_cfg.get("num_rounds"))
    uncounted = (
        _last_round_missing(summary, hydra_cfg.get("num_rounds"), records) if finished and scanned.skipped else None
    )
    curve = tuple((int(r["round"]), float(r["eval/accuracy"])) for r in records if r.get("eval/accuracy") is not None)
    if summary is not None and summary.get("wall_time_s") is not None:
        wall = float(summary["wall_time_s"])
    else:
        wall = sum(float(r["time/round_s"]) for r in records if r.get("time/round_s") is not None)
    reason = summary.get("stop_reason") if summary is not None else None
    clock, sent, spent = (finite_series(records, name) for name in (SIM_TIME, COMM_MB, EPSILON))
    return Run(
        run_dir,
        config,
        seed,
        rounds,
        curve,
        finished and uncounted is None,
        wall,
        final_scalars(records),
        str(reason) if reason is not None else None,
        {name: scalar_series(records, name) for name in series},
        clock,
        sent,
        scanned.skipped,
        scanned.lines,
        uncounted,
        spent,
        is_running(run_dir),
    )


def along(run: Run, x: str) -> Series:
    """The running total that the x axis ``x`` (a key of :data:`CUMULATIVE`) reads: ``run.sim_time``,
    ``run.comm_mb`` or ``run.epsilon``."""
    return {"sim_time": run.sim_time, "comm_mb": run.comm_mb, "epsilon": run.epsilon}[x]


def at_target(run: Run, target: float, x: str) -> float | None:
    """The running total ``x`` (see :func:`along`) at the end of the first round whose test accuracy is at least
    ``target``; ``None`` if no round reached it or that round did not log the total."""
    first = next((round_num for round_num, acc in run.curve if acc >= target), None)
    return dict(along(run, x)).get(first) if first is not None else None


def seconds_to_target(run: Run, target: float) -> float | None:
    """The simulated clock (``sim/time_s``) at the end of the first round whose test accuracy is at least
    ``target``; ``None`` if no round reached it or that round has no simulated time (a run without a clock)."""
    return at_target(run, target, "sim_time")


def mb_to_target(run: Run, target: float) -> float | None:
    """The megabytes sent both ways (``comm/mb_total``) by the end of the first round whose test accuracy is at
    least ``target``; ``None`` if no round reached it or the run did not count bytes (written before they were)."""
    return at_target(run, target, "comm_mb")


def accuracy_within(run: Run, budget: float) -> float | None:
    """The ``eval/accuracy`` of the last evaluated round whose ``dp/epsilon`` is at most ``budget``: the model a run
    stopped at that budget (``dp.epsilon_max``) would end with. The last such round, not the best: picking the
    best round by its test accuracy would select on the test set. ``None`` without such a round (no DP, or the
    first evaluated round already spent more)."""
    spent = dict(run.epsilon)
    within = [acc for n, acc in run.curve if n in spent and spent[n] <= budget]
    return within[-1] if within else None


def split_metric(spec: str) -> tuple[str, str]:
    """``NAME:AGG`` as ``(NAME, AGG)``; a bare ``NAME`` is ``(NAME, "last")``. AGG is not checked here."""
    name, sep, agg = spec.rpartition(":")
    return (name, agg) if sep else (spec, "last")


def over_rounds(values: Sequence[float], agg: str) -> float | None:
    """``values`` (one per round, in round order) reduced by ``agg`` (one of :data:`AGGREGATES`); NaN when any
    value is NaN (a round that logged ``null``), ``None`` for no value."""
    if not values:
        return None
    if agg == "last":
        return values[-1]
    if any(math.isnan(v) for v in values):
        return math.nan
    reduce: dict[str, Callable[[Sequence[float]], float]] = {
        "mean": lambda v: math.fsum(v) / len(v),
        "sum": math.fsum,
        "max": max,
        "min": min,
    }
    return reduce[agg](values)


def fallback_names(name: str) -> list[str]:
    """The scalars of a fallback list ``A,B`` (``--metric A,B``, ``--plot A,B``) in order; a name is a list of one."""
    return name.split(",")


def logged_name(run: Run, name: str) -> str | None:
    """The first scalar of the fallback list ``name`` (:func:`fallback_names`) that ``run`` logged in some round,
    e.g. ``eval_personal/accuracy_mean`` for a personalised method and ``eval/accuracy`` for FedAvg of
    ``eval_personal/accuracy_mean,eval/accuracy``; ``None`` if it logged none."""
    return next((n for n in fallback_names(name) if n in run.finals), None)


def metric_value(run: Run, spec: str) -> float | None:
    """The run's value of ``--metric`` ``spec`` (``NAME`` or ``NAME:AGG``, NAME a scalar or a fallback list
    ``A,B``: the first the run logged, :func:`logged_name`): the last logged value (``finals``) or the ``series`` of
    NAME (loaded with :func:`load_run`'s ``series``) reduced over rounds by AGG."""
    names, agg = split_metric(spec)
    name = logged_name(run, names)
    if name is None:
        return None
    if agg == "last":
        return run.finals.get(name)
    return over_rounds([v for _, v in run.series.get(name, ())], agg)


def _int(value: Any) -> int:
    return value if _is_int(value) else 0


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def scalar_series(records: Sequence[dict[str, Any]], name: str) -> Series:
    """``(round, value)`` of every record holding the scalar ``name`` (``null`` reads as NaN)."""
    return tuple(
        (int(r["round"]), math.nan if r[name] is None else float(r[name]))
        for r in records
        if name in r and (r[name] is None or _is_number(r[name]))
    )


def finite_series(records: Sequence[dict[str, Any]], name: str) -> Series:
    """:func:`scalar_series` of ``name`` without its non-finite values (for the running totals of
    :data:`CUMULATIVE`)."""
    return tuple((n, v) for n, v in scalar_series(records, name) if math.isfinite(v))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def final_scalars(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each scalar's value in the last record holding it; ``null`` (a non-finite value) reads as NaN.
    Non-numeric fields (``clients``) and ``round`` are left out."""
    finals: dict[str, float] = {}
    for record in records:
        for name, value in record.items():
            if value is None:
                finals[name] = math.nan
            elif _is_number(value) and name != "round":
                finals[name] = float(value)
    return finals


def _finished(summary: dict[str, Any] | None, rounds: int, num_rounds: Any) -> bool:
    """Ended for good: ``summary.json`` says so (an early stop is finished, an interrupt is not); an older
    ``summary.json`` without ``finished`` counts when every configured round was logged."""
    if summary is None:
        return False
    if isinstance(summary.get("finished"), bool):
        return summary["finished"]
    return not isinstance(num_rounds, int) or rounds >= num_rounds


def _last_round_missing(
    summary: dict[str, Any] | None, num_rounds: Any, records: Sequence[dict[str, Any]]
) -> str | None:
    """For a damaged run that :func:`_finished` calls finished: why it is not counted as finished after all (its
    last round, ``summary.json``'s ``rounds``, else the configured ``num_rounds``, is not among the round
    records read), or ``None`` when that round is there."""
    last = _int(summary.get("rounds")) if summary is not None else 0
    last = last or _int(num_rounds)
    if not last:
        return "its last round is not known (summary.json gives no rounds, .hydra/config.yaml no num_rounds)"
    if any(r["round"] == last for r in records):
        return None
    return f"its last round ({last}) is not among them"


def load_runs(root: Path, series: Sequence[str] = ()) -> list[Run]:
    """Every run under ``root`` (see :func:`find_run_dirs`), with the per-round values of ``series``."""
    return [load_run(path, root, series) for path in find_run_dirs(root)]
