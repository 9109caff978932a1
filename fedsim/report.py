"""Compare the runs of a sweep: ``python -m fedsim.report <sweep dir> [--target 0.6] [--out DIR] [--metric NAME]
[--plot NAME] [--x round|wall_time|sim_time|comm_mb] [--grid ROWS COLS]``.

Every directory under the sweep dir that holds a ``metrics.jsonl`` or a ``summary.json`` is a run: finished,
unfinished, or failed (``summary.json``'s ``stop_reason`` is ``"error: ..."``; listed with its reason). Runs are
grouped into configurations by their Hydra overrides (``.hydra/overrides.yaml``, else the directory name)
without ``seed``; each configuration gets one table row and one ``report.csv`` row (seeds, final and best
test accuracy mean ± std over seeds, rounds to reach ``--target`` and, for runs on the simulated clock
(``clock=sampled|trace``), the simulated seconds to reach it and, for runs that counted their bytes
(``comm/mb_total``), the megabytes sent both ways by then, mean wall time) and one curve per plot.
``--metric NAME`` (repeatable) adds a column for any scalar of ``metrics.jsonl`` (``eval/loss``,
``fit/personal_loss``, ``strategy/h_norm``): its value in the last round that logged it, mean ± std over the
seeds that logged it. ``--plot NAME`` (repeatable; default ``eval/accuracy``, drawn as ``accuracy.png``) plots a
scalar against ``--x`` (the round, the wall time, the simulated time ``sim/time_s`` or the megabytes sent both
ways ``comm/mb_total``: runs without the latter two are left out of those plots, each named in a note) into
``<name>.png`` (see :mod:`fedsim.report_plot`; needs matplotlib: ``pip install fedsim[plot]``). Reads files
only; no Hydra, no torch. ``--grid ROWS COLS`` adds two-way tables (``grid.csv``, ``grid.md``; see
:mod:`fedsim.report_grid`).
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedsim.report_grid import grid_problem, report_grids
from fedsim.report_plot import ACCURACY, ROUND_TIME, X_AXES, have_matplotlib, labels, mean_curve, plot_metric, png_name
from fedsim.report_runs import CUMULATIVE, Run, along, at_target, load_runs, mb_to_target, seconds_to_target, split_seed

__all__ = ["ConfigStats", "Run", "aggregate", "csv_rows", "format_table", "group_runs", "labels", "load_runs", "main",
           "mb_to_target", "mean_curve", "mean_std", "plot_accuracy", "plot_metric", "rounds_to_target", "seconds_to_target",
           "split_seed", "status", "table_rows", "unclocked_lines", "unfinished_lines", "unplotted_lines", "write_csv",
           "write_plots"]

PROG = "fedsim.report"
TOTALS = {  # per running total (the --x axes of CUMULATIVE): table header, cell when unlogged, report.csv fields
    "sim_time": ("sim s", "no clock", "sim_seconds_to_target", "seeds_reached_target_sim"),
    "comm_mb": ("MB", "no bytes", "mb_to_target", "seeds_reached_target_mb"),
}
METRIC_NAME = re.compile(r"[A-Za-z0-9_.\-/]+")  # as fedsim.round_metrics.NAME (not imported: no torch here)


@dataclass(frozen=True)
class ConfigStats:
    """One configuration aggregated over its seeds; ``None`` where there is nothing to aggregate."""

    config: tuple[str, ...]
    finished: int
    total: int
    rounds: tuple[int, int]  # fewest and most rounds logged by a seed
    final: tuple[float | None, float | None]  # mean, sample std
    best: tuple[float | None, float | None]
    to_target: float | None  # mean rounds to target over the seeds that reached it
    reached: int
    wall_time_s: float | None
    failures: tuple[str, ...] = ()  # "seed=1: error: ..." per failed run
    metrics: dict[str, tuple[float | None, float | None]] = field(default_factory=dict, hash=False)  # --metric
    clocked: int = 0  # seeds that logged sim/time_s (ran on the simulated clock)
    sim_to_target: tuple[float | None, float | None] = (None, None)  # simulated s to target: mean, std
    sim_reached: int = 0  # seeds whose sim/time_s at the target round is known
    metered: int = 0  # seeds that logged comm/mb_total (runs written before fedsim counted bytes did not)
    mb_to_target: tuple[float | None, float | None] = (None, None)  # MB sent both ways by the target: mean, std
    mb_reached: int = 0  # seeds whose comm/mb_total at the target round is known


def group_runs(runs: Sequence[Run]) -> dict[tuple[str, ...], list[Run]]:
    """Runs by configuration, configurations in order of their first run."""
    groups: dict[tuple[str, ...], list[Run]] = {}
    for run in runs:
        groups.setdefault(run.config, []).append(run)
    return groups


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (n - 1); std is ``None`` for fewer than two values, NaN when
    a value is NaN or infinite."""
    if not values:
        return None, None
    if not all(math.isfinite(v) for v in values):
        return statistics.fmean(values), math.nan if len(values) > 1 else None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def rounds_to_target(curve: Sequence[tuple[int, float]], target: float) -> int | None:
    """The first round whose test accuracy is at least ``target``; ``None`` if none is."""
    return next((round_num for round_num, acc in curve if acc >= target), None)


def aggregate(config: tuple[str, ...], runs: Sequence[Run], target: float | None = None,
              metrics: Sequence[str] = ()) -> ConfigStats:
    """Summarise one configuration over its seeds. Unfinished runs count with what they have logged.
    Each of ``metrics`` gets the mean ± std of its final value over the seeds that logged it."""
    evaluated = [r for r in runs if r.curve]
    hits = [n for n in (rounds_to_target(r.curve, target) for r in runs) if n is not None] if target is not None else []
    seconds, megabytes = (_totals_at_target(runs, target, x) for x in ("sim_time", "comm_mb"))
    return ConfigStats(
        config=config,
        finished=sum(r.finished for r in runs),
        total=len(runs),
        rounds=(min(r.rounds for r in runs), max(r.rounds for r in runs)),
        final=mean_std([r.curve[-1][1] for r in evaluated]),
        best=mean_std([max(acc for _, acc in r.curve) for r in evaluated]),
        to_target=statistics.fmean(hits) if hits else None,
        reached=len(hits),
        wall_time_s=statistics.fmean(r.wall_time_s for r in runs) if runs else None,
        failures=tuple(f"seed={r.seed}: {r.stop_reason}" for r in runs if r.failed),
        metrics={name: mean_std([r.finals[name] for r in runs if name in r.finals]) for name in metrics},
        clocked=sum(bool(r.sim_time) for r in runs),
        sim_to_target=mean_std(seconds),
        sim_reached=len(seconds),
        metered=sum(bool(r.comm_mb) for r in runs),
        mb_to_target=mean_std(megabytes),
        mb_reached=len(megabytes),
    )


def _totals_at_target(runs: Sequence[Run], target: float | None, x: str) -> list[float]:
    """The running total ``x`` (``sim_time`` or ``comm_mb``) at the target round of each seed that reached it."""
    if target is None:
        return []
    return [v for v in (at_target(r, target, x) for r in runs) if v is not None]


def _pm(pair: tuple[float | None, float | None], digits: int = 4) -> str:
    mean, std = pair
    if mean is None:
        return "-"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if std is not None else f"{mean:.{digits}f}"


def _at_target(s: ConfigStats, x: str) -> tuple[int, tuple[float | None, float | None], int]:
    """The seeds that logged the running total ``x`` (``sim_time``, ``comm_mb``), its mean ± std at the target
    and the seeds that reached the target with it known."""
    return (s.clocked, s.sim_to_target, s.sim_reached) if x == "sim_time" else (s.metered, s.mb_to_target, s.mb_reached)


def _total_cell(s: ConfigStats, x: str) -> str:
    """``mean ± std (reached/seeds)`` of the running total ``x`` at the target: the simulated seconds (``sim_time``,
    1 decimal) or the megabytes sent (``comm_mb``, 3 significant digits); ``- (0/seeds)`` when no seed reached it,
    ``- (no clock)`` / ``- (no bytes)`` for a configuration that did not log the total."""
    logged, pair, reached = _at_target(s, x)
    if not logged:
        return f"- ({TOTALS[x][1]})"
    return f"{_pm(pair, 1 if x == 'sim_time' else _mb_digits(pair[0]))} ({reached}/{s.total})"


def _mb_digits(mb: float | None) -> int:
    """Decimals that show ``mb`` to 3 significant digits (at least 1): 0.0366, 1.83, 18.3, 183.0."""
    return max(1, 2 - math.floor(math.log10(mb))) if mb is not None and math.isfinite(mb) and mb > 0 else 1


def _total_columns(stats: Sequence[ConfigStats], target: float | None) -> list[str]:
    """The running totals (``sim_time``, ``comm_mb``) whose to-target columns the table and CSV get: those of a
    target and a configuration that logged the total."""
    return [x for x in TOTALS if any(_at_target(s, x)[0] for s in stats)] if target is not None else []


def table_rows(stats: Sequence[ConfigStats], target: float | None) -> list[list[str]]:
    """The printed table as cells, header first."""
    short, _ = labels([s.config for s in stats])
    any_failed = any(s.failures for s in stats)
    header = ["configuration", "seeds"] + (["failed"] if any_failed else []) + ["rounds", "final acc", "best acc"]
    header += [f"rounds to {target:g}"] if target is not None else []
    totals = _total_columns(stats, target)
    header += [f"{TOTALS[x][0]} to {target:g}" for x in totals]
    names = list(stats[0].metrics) if stats else []
    rows = [header + ["wall s"] + names]
    for s in stats:
        lo, hi = s.rounds
        row = [short[s.config], f"{s.finished}/{s.total}"] + ([f"{len(s.failures)}"] if any_failed else [])
        row += [f"{hi}" if lo == hi else f"{lo}-{hi}", _pm(s.final), _pm(s.best)]
        if target is not None:
            row.append(f"{s.to_target:g} ({s.reached}/{s.total})" if s.to_target is not None else f"- (0/{s.total})")
        row += [_total_cell(s, x) for x in totals]
        row.append("-" if s.wall_time_s is None else f"{s.wall_time_s:.1f}")
        rows.append(row + [_pm(s.metrics[name]) for name in names])
    return rows


def format_table(stats: Sequence[ConfigStats], target: float | None = None) -> str:
    """A fixed-width text table, preceded by the overrides every configuration shares."""
    rows = table_rows(stats, target)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in rows]
    _, common = labels([s.config for s in stats])
    return "\n".join(([f"common overrides: {' '.join(common)}"] if common else []) + lines)


def csv_rows(stats: Sequence[ConfigStats], target: float | None = None) -> list[dict[str, Any]]:
    """One flat dict per configuration: the columns of ``report.csv`` (empty where undefined)."""
    rows = []
    any_failed = any(s.failures for s in stats)
    for s in stats:
        row: dict[str, Any] = {"configuration": ",".join(s.config), "seeds_finished": s.finished, "seeds_total": s.total}
        if any_failed:  # as the target columns: only when there is something to say
            row.update(status=status(s), seeds_failed=len(s.failures), failures="; ".join(s.failures))
        row |= {
            "rounds_min": s.rounds[0], "rounds_max": s.rounds[1],
            "final_accuracy_mean": s.final[0], "final_accuracy_std": s.final[1],
            "best_accuracy_mean": s.best[0], "best_accuracy_std": s.best[1],
        }
        if target is not None:
            row.update(target=target, rounds_to_target_mean=s.to_target, seeds_reached_target=s.reached)
        for x in _total_columns(stats, target):
            _, (mean, std), reached = _at_target(s, x)
            *_, name, seeds = TOTALS[x]
            row.update({f"{name}_mean": mean, f"{name}_std": std, seeds: reached})
        row["wall_time_s_mean"] = s.wall_time_s
        for name, (mean, std) in s.metrics.items():
            row.update({f"{name}_mean": mean, f"{name}_std": std})
        rows.append({k: "" if v is None else v for k, v in row.items()})
    return rows


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Write ``rows`` (same keys each) as CSV."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def status(s: ConfigStats) -> str:
    """``failed`` if a seed failed, else ``finished`` when every seed finished, else ``unfinished``."""
    return "failed" if s.failures else "finished" if s.finished == s.total else "unfinished"


def plot_accuracy(groups: dict[tuple[str, ...], list[Run]], path: Path, target: float | None = None) -> bool:
    """Test accuracy per round for each configuration (see :func:`~fedsim.report_plot.plot_metric`); ``False``
    without matplotlib or without an evaluated round."""
    return have_matplotlib() and plot_metric(groups, path, ACCURACY, "round", target)


def unfinished_lines(runs: Sequence[Run], root: Path) -> list[str]:
    """One line per run that has not finished: ``failed: <dir> (<n> rounds logged): error: ...`` for a run
    stopped by an error, else ``unfinished: <dir> (<n> rounds logged[, no summary.json])``."""
    lines = []
    for r in runs:
        where = r.path.relative_to(root) if r.path != root else r.path
        if r.failed:
            lines.append(f"failed: {where} ({r.rounds} rounds logged): {r.stop_reason}")
        elif not r.finished:
            lines.append(f"unfinished: {where} ({r.rounds} rounds logged"
                         f"{'' if (r.path / 'summary.json').exists() else ', no summary.json'})")
    return lines


UNLOGGED = {  # per running total: why no run logged it, and why one run did not
    "sim_time": ("run with clock=sampled or clock=trace", "no clock"),
    "comm_mb": ("runs written before fedsim counted bytes", "written before fedsim counted bytes"),
}


def unplotted_lines(runs: Sequence[Run], root: Path, x: str) -> list[str]:
    """For ``--x sim_time`` or ``--x comm_mb``: one line per run that logged rounds but not the running total
    (``sim/time_s``, ``comm/mb_total``; left out of the plots); a single line when no run did."""
    name, (hint, why) = CUMULATIVE[x], UNLOGGED[x]
    if not any(along(r, x) for r in runs):
        return [f"{PROG}: no run logged {name} ({hint}); nothing to plot against {x}"]
    return [f"{PROG}: {r.path.relative_to(root) if r.path != root else r.path} logged no {name} ({why}); "
            f"left out of the {x} plots" for r in runs if r.rounds and not along(r, x)]


def unclocked_lines(runs: Sequence[Run], root: Path) -> list[str]:
    """:func:`unplotted_lines` for ``--x sim_time``."""
    return unplotted_lines(runs, root, "sim_time")


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1 or math.isnan(value):
        raise argparse.ArgumentTypeError(f"must be an accuracy in (0, 1], got {text}")
    return value


def _metric(text: str) -> str:
    if not METRIC_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be a scalar name such as fit/personal_loss, got {text!r}")
    return text


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path, help="a Hydra multirun dir (or any dir holding run dirs)")
    parser.add_argument("--target", type=_fraction, default=None, help="report rounds to reach this test accuracy")
    parser.add_argument("--out", type=Path, default=None, help="where report.csv and the plots go (default: sweep_dir)")
    parser.add_argument("--metric", type=_metric, action="append", default=[], metavar="NAME",
                        help="add a column (this scalar's final value, mean ± std over seeds) and its plot, NAME.png (repeatable)")
    parser.add_argument("--plot", type=_metric, action="append", default=[], metavar="NAME",
                        help=f"plot this scalar per configuration into NAME.png (repeatable; default {ACCURACY}, "
                             "drawn as accuracy.png)")
    parser.add_argument("--x", choices=list(X_AXES), default="round",
                        help=f"the plots' x axis: the round (default), wall_time (the running sum of {ROUND_TIME}), "
                             f"sim_time ({CUMULATIVE['sim_time']}, the simulated clock: clock=sampled|trace) or "
                             f"comm_mb ({CUMULATIVE['comm_mb']}, megabytes sent both ways)")
    parser.add_argument("--grid", nargs=2, metavar=("ROWS", "COLS"), default=None, help="also a ROWS x COLS table of "
                        "final eval/accuracy and each --metric (e.g. strategy attack) into grid.csv and grid.md")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table, write ``report.csv`` and ``accuracy.png``; exit status 2 when there are no runs."""
    args = parse_args(argv)
    root: Path = args.sweep_dir
    plots = list(dict.fromkeys([*(args.plot or [ACCURACY]), *args.metric]))  # every --metric is plotted too
    runs = load_runs(root, series=plots + ([ROUND_TIME] if args.x == "wall_time" else []))
    if not runs:
        print(f"{PROG}: no runs (metrics.jsonl or summary.json) under {root}", file=sys.stderr)
        return 2
    if args.grid and (problem := grid_problem(runs, args.grid)):
        print(problem, file=sys.stderr)
        return 2
    groups = group_runs(runs)
    metrics = list(dict.fromkeys(args.metric))
    stats = [aggregate(config, members, args.target, metrics) for config, members in groups.items()]
    print(format_table(stats, args.target))
    for line in unfinished_lines(runs, root):
        print(line)
    for name in metrics:
        if not any(name in r.finals for r in runs):
            print(f"{PROG}: no run logged {name}")
    for line in unplotted_lines(runs, root, args.x) if args.x in CUMULATIVE else []:
        print(line)
    out: Path = args.out if args.out is not None else root
    out.mkdir(parents=True, exist_ok=True)
    write_csv(csv_rows(stats, args.target), out / "report.csv")
    grids = report_grids(runs, args.grid, metrics, out) if args.grid else []
    written = [out / "report.csv", *grids] + write_plots(groups, out, plots, args.x, args.target)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def write_plots(groups: dict[tuple[str, ...], list[Run]], out: Path, plots: Sequence[str], x: str,
                target: float | None) -> list[Path]:
    """One PNG per name in ``plots``; says in one line why one was not drawn. The paths written."""
    names = [png_name(metric) for metric in plots]
    if not have_matplotlib():
        print(f"{PROG}: matplotlib is not installed (pip install 'fedsim[plot]'); skipped {', '.join(names)}")
        return []
    written = []
    for metric, name in zip(plots, names):
        if plot_metric(groups, out / name, metric, x, target):
            written.append(out / name)
        else:
            needed = {"wall_time": f" with {ROUND_TIME}", **{k: f" with {v}" for k, v in CUMULATIVE.items()}}.get(x, "")
            print(f"{PROG}: no run logged {metric}{needed}; skipped {name}")
    return written


if __name__ == "__main__":
    sys.exit(main())
