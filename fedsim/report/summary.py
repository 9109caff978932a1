"""One configuration of a sweep summarised over its seeds: the numbers of its table row and ``report.csv`` row."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from fedsim.report.notes import damage
from fedsim.report.runs import Run, accuracy_within, at_target, metric_value
from fedsim.report.table import ConfigStats


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


def aggregate(
    config: tuple[str, ...],
    runs: Sequence[Run],
    target: float | None = None,
    metrics: Sequence[str] = (),
    budget: float | None = None,
) -> ConfigStats:
    """Summarise one configuration over its seeds. Unfinished runs count with what they have logged.
    Each of ``metrics`` (``NAME`` or ``NAME:AGG``, see :func:`~fedsim.report.runs.metric_value`) gets the mean ±
    std of its value over the seeds that logged it; with ``budget``, the accuracy within that ε
    (:func:`~fedsim.report.runs.accuracy_within`) too, over the seeds that had a round within it."""
    within = [v for v in (accuracy_within(r, budget) for r in runs) if v is not None] if budget is not None else []
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
        damaged=tuple(f"seed={r.seed}: {damage(r)}" for r in runs if r.damaged),
        metrics={name: mean_std(_values(runs, name)) for name in metrics},
        clocked=sum(bool(r.sim_time) for r in runs),
        sim_to_target=mean_std(seconds),
        sim_reached=len(seconds),
        metered=sum(bool(r.comm_mb) for r in runs),
        mb_to_target=mean_std(megabytes),
        mb_reached=len(megabytes),
        private=sum(bool(r.epsilon) for r in runs),
        running=sum(r.running for r in runs),
        within_budget=mean_std(within),
        within_reached=len(within),
    )


def _values(runs: Sequence[Run], spec: str) -> list[float]:
    """The value of ``--metric`` ``spec`` of each run that logged it."""
    return [v for v in (metric_value(r, spec) for r in runs) if v is not None]


def _totals_at_target(runs: Sequence[Run], target: float | None, x: str) -> list[float]:
    """The running total ``x`` (``sim_time`` or ``comm_mb``) at the target round of each seed that reached it."""
    if target is None:
        return []
    return [v for v in (at_target(r, target, x) for r in runs) if v is not None]
