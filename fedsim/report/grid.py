"""Two-way tables of a sweep for :mod:`fedsim.report`: ``python -m fedsim.report SWEEP --grid ROWS COLS
[--metric NAME]``, e.g. ``--grid strategy attack`` for a defence × attack table.

Rows are the values of the override ``ROWS``, columns those of ``COLS`` (in the order the sweep's jobs first
used them), and a cell is the final value of a scalar (``eval/accuracy``, and each ``--metric``: its value in the
last round that logged it), mean ± sample std over the seeds of that cell; one grid per scalar. A run without
the override (``attack=`` never given) counts as the key's default and is labelled ``(default)``; ``attack=none``
given explicitly stays ``none`` (the report reads overrides, not the composed config).

Other overrides that differ between runs are never merged into one cell: the runs are split into one grid per
combination of their values (``attack.fraction=0.1`` and ``attack.fraction=0.2``: two grids, each titled by
it); overrides every run shares are printed once. Rows and columns in which no run logged the scalar are left
out of its grid, with one line saying so (``attack/backdoor_success`` exists only for ``attack=backdoor``).
The grids are printed and written to ``grid.md`` and ``grid.csv`` (one row per grid row: ``metric``, the splitting
overrides, the row value, then ``<column>_mean``, ``<column>_std`` and ``<column>_seeds`` per column value).
Reads files only; no Hydra, no torch.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedsim.report.runs import Run, metric_value, split_metric

PROG = "fedsim.report"
ACCURACY = "eval/accuracy"
DEFAULT = "(default)"  # the label of a run that did not override the key
Cell = tuple[str, str]  # (row value, column value)


@dataclass(frozen=True)
class Grid:
    """One table: ``values[(row, col)]`` holds the final value of ``metric`` of each seed of that cell that logged
    it (``runs[(row, col)]`` counts all its seeds); ``split`` names the overrides (``key=value``) that set this
    grid apart from the sweep's other grids (empty when there is one grid)."""

    metric: str
    keys: tuple[str, str]
    split: tuple[str, ...]
    rows: tuple[str, ...]
    cols: tuple[str, ...]
    values: dict[Cell, tuple[float, ...]]
    runs: dict[Cell, int]
    dropped: tuple[str, ...] = ()  # "row X", "column Y": no run there logged the metric


def override_key(key: str) -> str:
    """A key as the report compares it: without Hydra's ``+``, ``++`` or ``~`` prefix."""
    return key.lstrip("+~")


def settings(run: Run) -> dict[str, str]:
    """The run's overrides (without ``seed``) as ``{key: value}``."""
    pairs = (item.partition("=") for item in run.config)
    return {override_key(key): value for key, _, value in pairs}


def value_of(run: Run, key: str) -> str:
    """The run's value of the override ``key``; :data:`DEFAULT` when the run did not give it."""
    return settings(run).get(override_key(key), DEFAULT)


def grid_problem(runs: Sequence[Run], keys: Sequence[str]) -> str | None:
    """Why ``--grid ROWS COLS`` cannot be drawn from ``runs`` (one line), or ``None`` when it can."""
    rows_key, cols_key = (override_key(k) for k in keys)
    if rows_key == cols_key:
        return f"{PROG}: --grid needs two different keys (got {rows_key} twice)"
    if "seed" in (rows_key, cols_key):
        return f"{PROG}: --grid cannot use seed: a cell is the mean over the seeds"
    known = sorted({key for run in runs for key in settings(run)})
    missing = [key for key in (rows_key, cols_key) if key not in known]
    if missing:
        return f"{PROG}: --grid: no run overrides {' or '.join(missing)} (the runs' keys: {', '.join(known) or 'none'})"
    return None


def split_keys(runs: Sequence[Run], keys: Sequence[str]) -> list[str]:
    """The overrides other than ``keys`` whose value (or absence) differs between runs: each combination of
    their values gets its own grid."""
    exclude = {override_key(k) for k in keys}
    every = sorted({key for run in runs for key in settings(run)} - exclude)
    return [key for key in every if len({value_of(run, key) for run in runs}) > 1]


def common_overrides(runs: Sequence[Run], keys: Sequence[str]) -> list[str]:
    """``key=value`` of the overrides that every run gives with the same value (``keys`` aside)."""
    exclude = {override_key(k) for k in keys}
    shared = set.intersection(*(set(settings(run).items()) for run in runs)) if runs else set()
    return [f"{key}={value}" for key, value in sorted(shared) if key not in exclude]


def split_runs(runs: Sequence[Run], keys: Sequence[str]) -> dict[tuple[str, ...], list[Run]]:
    """Runs by the values of :func:`split_keys` (``key=value`` tuples, empty for a single grid), in job order."""
    varying = split_keys(runs, keys)
    groups: dict[tuple[str, ...], list[Run]] = {}
    for run in runs:
        groups.setdefault(tuple(f"{key}={value_of(run, key)}" for key in varying), []).append(run)
    return groups


def final_value(run: Run, metric: str) -> float | None:
    """The run's last logged value of ``metric``: for ``eval/accuracy`` the last evaluated round's (as the main
    table's "final acc"), for any other scalar its value in the last round that logged it, for ``NAME:AGG`` NAME's
    values over the rounds reduced by AGG (:func:`~fedsim.report.runs.metric_value`); ``None`` if never."""
    if metric == ACCURACY:
        return run.curve[-1][1] if run.curve else None
    return metric_value(run, metric)


def build_grid(runs: Sequence[Run], keys: Sequence[str], metric: str, split: tuple[str, ...] = ()) -> Grid:
    """The grid of ``metric`` over ``runs`` (all sharing every override but ``keys`` and ``seed``)."""
    rows_key, cols_key = keys
    values: dict[Cell, list[float]] = {}
    counts: dict[Cell, int] = {}
    for run in runs:
        cell = (value_of(run, rows_key), value_of(run, cols_key))
        counts[cell] = counts.get(cell, 0) + 1
        value = final_value(run, metric)
        values.setdefault(cell, []).extend([] if value is None else [value])
    rows = list(dict.fromkeys(row for row, _ in counts))
    cols = list(dict.fromkeys(col for _, col in counts))
    kept_rows = [r for r in rows if any(values.get((r, c)) for c in cols)]
    kept_cols = [c for c in cols if any(values.get((r, c)) for r in rows)]
    dropped = [f"row {r}" for r in rows if r not in kept_rows] + [f"column {c}" for c in cols if c not in kept_cols]
    return Grid(
        metric,
        (rows_key, cols_key),
        split,
        tuple(kept_rows),
        tuple(kept_cols),
        {cell: tuple(v) for cell, v in values.items()},
        counts,
        tuple(dropped),
    )


def build_grids(runs: Sequence[Run], keys: Sequence[str], metrics: Sequence[str]) -> list[Grid]:
    """One grid per scalar in ``metrics`` and per combination of the splitting overrides (see :func:`split_runs`)."""
    keys = tuple(override_key(k) for k in keys)
    return [
        build_grid(members, keys, metric, split)
        for metric in metrics
        for split, members in split_runs(runs, keys).items()
    ]


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (n − 1), as the main table's: std ``None`` for one value, NaN when a
    value is not finite."""
    if not values:
        return None, None
    if len(values) == 1:
        return values[0], None
    if not all(math.isfinite(v) for v in values):
        return statistics.fmean(values), math.nan
    return statistics.fmean(values), statistics.stdev(values)


def cell_text(grid: Grid, cell: Cell) -> str:
    """``mean ± std`` to 4 decimals, ``(n=k)`` added when fewer seeds than the grid's most gave a value; ``-``
    for no value."""
    found = grid.values.get(cell, ())
    mean, std = mean_std(found)
    if mean is None:
        return "-"
    text = f"{mean:.4f}" if std is None else f"{mean:.4f} ± {std:.4f}"
    most = max((len(v) for v in grid.values.values()), default=0)
    return text if len(found) == most else f"{text} (n={len(found)})"


def title(grid: Grid) -> str:
    """``final eval/accuracy, mean ± std over seeds`` and the grid's splitting overrides."""
    where = f" [{' '.join(grid.split)}]" if grid.split else ""
    what = "final " if split_metric(grid.metric)[1] == "last" else ""
    return f"{what}{grid.metric}, mean ± std over seeds{where}"


def table_cells(grid: Grid) -> list[list[str]]:
    """The grid as cells, header first (``ROWS \\ COLS`` in the corner)."""
    rows_key, cols_key = grid.keys
    return [[f"{rows_key} \\ {cols_key}", *grid.cols]] + [
        [row, *(cell_text(grid, (row, col)) for col in grid.cols)] for row in grid.rows
    ]


def format_grid(grid: Grid) -> str:
    """The title, then a fixed-width table (first column left-aligned, cells right-aligned)."""
    cells = table_cells(grid)
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in cells
    ]
    return "\n".join([title(grid), *lines])


def markdown_grid(grid: Grid) -> str:
    """The title as a heading, then a Markdown table."""
    cells = [[c.replace("|", "\\|") for c in row] for row in table_cells(grid)]
    lines = [f"| {' | '.join(row)} |" for row in cells]
    lines.insert(1, "|" + "---|" * len(cells[0]))
    return "\n".join([f"### {title(grid)}", "", *lines])


def csv_rows(grids: Sequence[Grid]) -> list[dict[str, object]]:
    """One row per grid row: ``metric``, each splitting override, the row key, then ``<col>_mean``, ``<col>_std``,
    ``<col>_seeds`` for every column value of any grid (empty where the grid has no such column or value)."""
    split_names = list(dict.fromkeys(item.partition("=")[0] for g in grids for item in g.split))
    cols = list(dict.fromkeys(col for g in grids for col in g.cols))
    out = []
    for g in grids:
        fixed = dict(item.partition("=")[::2] for item in g.split)
        for row in g.rows:
            line: dict[str, object] = {"metric": g.metric, **{k: fixed.get(k, "") for k in split_names}, g.keys[0]: row}
            for col in cols:
                found = g.values.get((row, col), ()) if col in g.cols else ()
                mean, std = mean_std(found)
                line.update(
                    {
                        f"{col}_mean": "" if mean is None else mean,
                        f"{col}_std": "" if std is None else std,
                        f"{col}_seeds": len(found) if col in g.cols else "",
                    }
                )
            out.append(line)
    return out


def write_grids(grids: Sequence[Grid], common: Sequence[str], out: Path) -> list[Path]:
    """``grid.md`` (the common overrides, then each grid) and ``grid.csv`` (:func:`csv_rows`) in ``out``."""
    md = out / "grid.md"
    head = [f"common overrides: `{' '.join(common)}`", ""] if common else []
    md.write_text(
        "\n\n".join(["\n".join(head).rstrip(), *(markdown_grid(g) for g in grids)]).lstrip() + "\n", encoding="utf-8"
    )
    rows = csv_rows(grids)
    path = out / "grid.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
        writer.writeheader()
        writer.writerows(rows)
    return [path, md]


def report_grids(runs: Sequence[Run], keys: Sequence[str], metrics: Sequence[str], out: Path) -> list[Path]:
    """Print the grids of ``eval/accuracy`` and of each of ``metrics`` (the common overrides first, a line per left
    out row or column), write them to ``out`` (see :func:`write_grids`); the paths written."""
    names = list(dict.fromkeys([ACCURACY, *metrics]))
    grids = [g for g in build_grids(runs, keys, names) if g.rows]
    common = common_overrides(runs, keys)
    shared = f"; common overrides: {' '.join(common)}" if common else ""
    print(f"\ngrid: {' × '.join(override_key(k) for k in keys)}{shared}")
    for grid in grids:
        print("\n" + format_grid(grid))
        if grid.dropped:
            print(f"{PROG}: no run logged {grid.metric} in {', '.join(grid.dropped)}; left out of this grid")
    for name in names:
        if not any(g.metric == name for g in grids):
            print(f"{PROG}: no run logged {name}; no grid")
    return write_grids(grids, common, out) if grids else []
