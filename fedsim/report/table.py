"""The report's table and ``report.csv``: one row per configuration of a sweep (:class:`ConfigStats`, what
:func:`fedsim.report.aggregate` makes of its seeds), mean ± std over the seeds, the to-target columns of the running
totals (simulated seconds, megabytes) only where a configuration logged them, the ``failed`` and ``damaged``
columns only where a run failed or read a damaged ``metrics.jsonl``."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedsim.report.plot import labels, split_common


def differing_first(config: tuple[str, ...], common: Sequence[str]) -> tuple[str, ...]:
    """``config``'s overrides that not every configuration shares, then the shared ones (``common``)."""
    shared = set(common)
    return tuple(o for o in config if o not in shared) + tuple(o for o in config if o in shared)


TOTALS = {  # per running total (the --x axes of CUMULATIVE): table header, cell when unlogged, report.csv fields
    "sim_time": ("sim s", "no clock", "sim_seconds_to_target", "seeds_reached_target_sim"),
    "comm_mb": ("MB", "no bytes", "mb_to_target", "seeds_reached_target_mb"),
}


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
    damaged: tuple[str, ...] = ()  # "seed=1: 2 lines skipped" per run whose metrics.jsonl is damaged
    private: int = 0  # seeds that logged dp/epsilon (ran with differential privacy)
    within_budget: tuple[float | None, float | None] = (None, None)  # accuracy at dp/epsilon <= budget: mean, std
    within_reached: int = 0  # seeds with an evaluated round within the budget
    running: int = 0  # seeds whose run still holds its directory (being written)


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


def _budget_cell(s: ConfigStats) -> str:
    """``mean ± std (seeds with a round within the budget/seeds)``; ``- (0/n)`` when none had one, ``- (no DP)``
    for a configuration that did not log ``dp/epsilon``."""
    if not s.private:
        return "- (no DP)"
    return f"{_pm(s.within_budget)} ({s.within_reached}/{s.total})"


def table_rows(stats: Sequence[ConfigStats], target: float | None, budget: float | None = None) -> list[list[str]]:
    """The printed table as cells, header first; with ``budget`` (``--epsilon-budget``) an ``acc at eps<=B``
    column."""
    short, _ = labels([s.config for s in stats])
    any_failed, any_damaged = any(s.failures for s in stats), any(s.damaged for s in stats)
    header = ["configuration", "seeds"] + (["failed"] if any_failed else []) + (["damaged"] if any_damaged else [])
    header += ["rounds", "final acc", "best acc"]
    header += [f"rounds to {target:g}"] if target is not None else []
    totals = _total_columns(stats, target)
    header += [f"{TOTALS[x][0]} to {target:g}" for x in totals]
    header += [f"acc at eps<={budget:g}"] if budget is not None else []
    names = list(stats[0].metrics) if stats else []
    rows = [header + ["wall s"] + names]
    for s in stats:
        lo, hi = s.rounds
        row = [short[s.config], f"{s.finished}/{s.total}"] + ([f"{len(s.failures)}"] if any_failed else [])
        row += [f"{len(s.damaged)}"] if any_damaged else []
        row += [f"{hi}" if lo == hi else f"{lo}-{hi}", _pm(s.final), _pm(s.best)]
        if target is not None:
            row.append(f"{s.to_target:g} ({s.reached}/{s.total})" if s.to_target is not None else f"- (0/{s.total})")
        row += [_total_cell(s, x) for x in totals]
        row += [_budget_cell(s)] if budget is not None else []
        row.append("-" if s.wall_time_s is None else f"{s.wall_time_s:.1f}")
        rows.append(row + [_pm(s.metrics[name]) for name in names])
    return rows


def format_table(stats: Sequence[ConfigStats], target: float | None = None, budget: float | None = None) -> str:
    """A fixed-width text table, preceded by the overrides every configuration shares."""
    rows = table_rows(stats, target, budget)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
    _, common = labels([s.config for s in stats])
    return "\n".join(([f"common overrides: {' '.join(common)}"] if common else []) + lines)


def csv_rows(
    stats: Sequence[ConfigStats], target: float | None = None, budget: float | None = None
) -> list[dict[str, Any]]:
    """One flat dict per configuration: the columns of ``report.csv`` (empty where undefined). ``configuration``
    holds every override but ``seed``, those that differ between configurations first."""
    rows = []
    any_failed, any_damaged = any(s.failures for s in stats), any(s.damaged for s in stats)
    _, common = split_common([s.config for s in stats])
    for s in stats:
        row: dict[str, Any] = {
            "configuration": ",".join(differing_first(s.config, common)),
            "seeds_finished": s.finished,
            "seeds_total": s.total,
        }
        if any_failed:  # as the target columns: only when there is something to say
            row.update(status=status(s), seeds_failed=len(s.failures), failures="; ".join(s.failures))
        if any_damaged:  # a run whose metrics.jsonl had lines that are not round records
            row.update(seeds_damaged=len(s.damaged), damaged="; ".join(s.damaged))
        row |= {
            "rounds_min": s.rounds[0],
            "rounds_max": s.rounds[1],
            "final_accuracy_mean": s.final[0],
            "final_accuracy_std": s.final[1],
            "best_accuracy_mean": s.best[0],
            "best_accuracy_std": s.best[1],
        }
        if target is not None:
            row.update(target=target, rounds_to_target_mean=s.to_target, seeds_reached_target=s.reached)
        for x in _total_columns(stats, target):
            _, (mean, std), reached = _at_target(s, x)
            *_, name, seeds = TOTALS[x]
            row.update({f"{name}_mean": mean, f"{name}_std": std, seeds: reached})
        if budget is not None:
            mean, std = s.within_budget
            row.update(
                epsilon_budget=budget,
                accuracy_at_epsilon_mean=mean,
                accuracy_at_epsilon_std=std,
                seeds_within_epsilon=s.within_reached,
            )
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
    """``failed`` if a seed failed, else ``finished`` when every seed finished, else ``running`` while a seed's run
    still holds its directory, else ``unfinished``."""
    if s.failures:
        return "failed"
    return "finished" if s.finished == s.total else "running" if s.running else "unfinished"
