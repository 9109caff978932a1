"""Compare the runs of a sweep: ``python -m fedsim.report <sweep dir> [--target 0.6] [--out DIR]
[--metric NAME[:AGG]] [--plot NAME] [--x round|wall_time|sim_time|comm_mb|epsilon] [--epsilon-budget B]
[--grid ROWS COLS] [--facet KEY]``.

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
``<name>.png`` (see :mod:`fedsim.report.plot`; needs matplotlib: ``pip install fedsim-torch[plot]``). Reads files
only; no Hydra, no torch. ``--grid ROWS COLS`` adds two-way tables (``grid.csv``, ``grid.md``; see
:mod:`fedsim.report.grid`).
``--metric A,B`` and ``--plot A,B`` take a fallback list: for each run, the first of the scalars it logged (e.g.
``eval_personal/accuracy_mean,eval/accuracy``: personalised methods' personal accuracy beside FedAvg's global one,
one column, one figure; :func:`~fedsim.report.runs.logged_name`).
``--metric NAME:AGG`` reduces the scalar over the rounds instead (AGG: last, the default, mean, sum, max, min;
:func:`~fedsim.report.runs.metric_value`). ``--x epsilon`` plots against the privacy budget spent (``dp/epsilon``);
``--epsilon-budget B`` adds the accuracy of the last evaluated round within ε ≤ B, mean ± std over seeds
(:func:`~fedsim.report.runs.accuracy_within`). ``--facet KEY`` draws one panel per value of the override KEY
(:func:`~fedsim.report.plot.draw_facets`). The table names a configuration by the overrides that differ and
prints those every configuration shares once, above it; ``report.csv`` lists the differing ones first.

A damaged ``metrics.jsonl`` (a run killed while writing it, or a foreign file in its place): a line is used only
when it is a round record as fedsim writes it, a JSON object whose ``round`` is a non-negative integer and whose
other fields are numbers or ``null``, but for ``clients``, a list of objects each with an integer ``client_id``
(:func:`fedsim.report.runs.is_round_record`). Blank lines are passed over; every other line (the last one cut
short, a line that is not JSON, JSON that is not a round record) is skipped, and the file is damaged. Each
damaged file gets one note, ``fedsim.report: <run>/metrics.jsonl is damaged: skipped K of N lines (<which and
why>); read the run from the other M``; the run is reported from its usable rows (final and best accuracy, rounds
to target, every column) and marked in the table (``damaged``: the configuration's damaged seeds) and in
``report.csv`` (``seeds_damaged``, and ``damaged``: ``seed=S: K lines skipped`` per damaged seed); these columns
exist only when a run is damaged. A damaged run counts as a finished seed only when it would count undamaged
(``summary.json`` says ``finished``; an older one without it, every configured round logged) and its last
round (``summary.json``'s ``rounds``, else ``num_rounds`` of ``.hydra/config.yaml``) is among its usable rows;
otherwise its note ends ``not counted as finished: ...`` and it is listed as unfinished. A run whose process still
holds its directory (``.fedsim.lock``; every fedsim run holds it while it writes) is listed as ``running``, never as
unfinished or damaged: its last line may be half written (that line is left out until the run has ended).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from fedsim.report.grid import grid_problem, report_grids
from fedsim.report.notes import (
    UNLOGGED,
    damage,
    damaged_lines,
    facet_problem,
    fallback_lines,
    unclocked_lines,
    unfinished_lines,
    unplotted_lines,
)
from fedsim.report.plot import (
    ACCURACY,
    ROUND_TIME,
    X_AXES,
    have_matplotlib,
    labels,
    mean_curve,
    plot_metric,
    png_name,
)
from fedsim.report.runs import (
    AGGREGATES,
    CUMULATIVE,
    Run,
    accuracy_within,
    fallback_names,
    load_runs,
    logged_name,
    mb_to_target,
    metric_value,
    seconds_to_target,
    split_metric,
    split_seed,
)
from fedsim.report.summary import aggregate, group_runs, mean_std, rounds_to_target
from fedsim.report.table import ConfigStats, csv_rows, format_table, status, table_rows, write_csv

__all__ = [
    "ConfigStats",
    "Run",
    "accuracy_within",
    "aggregate",
    "csv_rows",
    "damage",
    "damaged_lines",
    "facet_problem",
    "format_table",
    "group_runs",
    "labels",
    "load_runs",
    "main",
    "mb_to_target",
    "mean_curve",
    "mean_std",
    "metric_value",
    "plot_accuracy",
    "plot_metric",
    "rounds_to_target",
    "seconds_to_target",
    "split_seed",
    "status",
    "table_rows",
    "unclocked_lines",
    "unfinished_lines",
    "unplotted_lines",
    "write_csv",
    "write_plots",
]

PROG = "fedsim.report"
METRIC_NAME = re.compile(r"[A-Za-z0-9_.\-/]+")  # as fedsim.server.round_metrics.NAME (not imported: no torch here)


def plot_accuracy(groups: dict[tuple[str, ...], list[Run]], path: Path, target: float | None = None) -> bool:
    """Test accuracy per round for each configuration (see :func:`~fedsim.report.plot.plot_metric`); ``False``
    without matplotlib or without an evaluated round."""
    return have_matplotlib() and plot_metric(groups, path, ACCURACY, "round", target)


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1 or math.isnan(value):
        raise argparse.ArgumentTypeError(f"must be an accuracy in (0, 1], got {text}")
    return value


def _metric(text: str) -> str:
    """A scalar's name, or a fallback list of them (``A,B``: for each run, the first it logged)."""
    if not all(METRIC_NAME.fullmatch(name) for name in fallback_names(text)):
        raise argparse.ArgumentTypeError(
            f"must be a scalar name such as fit/personal_loss, or a list such as eval_personal/accuracy_mean,"
            f"eval/accuracy (each run: the first it logged), got {text!r}"
        )
    return text


def _metric_column(text: str) -> str:
    """``NAME`` or ``NAME:AGG``; ``NAME:last`` is ``NAME`` (the column of today's ``--metric NAME``)."""
    name, agg = split_metric(text)
    _metric(name)
    if agg not in AGGREGATES:
        raise argparse.ArgumentTypeError(f"{text!r}: AGG must be one of {', '.join(AGGREGATES)} (got {agg!r})")
    return name if agg == "last" else f"{name}:{agg}"


def _budget(text: str) -> float:
    value = float(text)
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a privacy budget ε > 0, got {text}")
    return value


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (``python -m fedsim.report: error: argument --metric: ...``), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _Parser(prog=f"python -m {PROG}", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path, help="a Hydra multirun dir (or any dir holding run dirs)")
    parser.add_argument("--target", type=_fraction, default=None, help="report rounds to reach this test accuracy")
    parser.add_argument("--out", type=Path, default=None, help="where report.csv and the plots go (default: sweep_dir)")
    parser.add_argument(
        "--metric",
        type=_metric_column,
        action="append",
        default=[],
        metavar="NAME[:AGG]",
        help="add a column (this scalar's last value, or with AGG its mean, sum, max or min over the rounds; mean ± "
        "std over seeds) and its plot, NAME.png (repeatable); NAME may be a list A,B: each run's first logged one",
    )
    parser.add_argument(
        "--plot",
        type=_metric,
        action="append",
        default=[],
        metavar="NAME",
        help=f"plot this scalar per configuration into NAME.png (repeatable; default {ACCURACY}, "
        "drawn as accuracy.png); NAME may be a list A,B: each run's first logged one",
    )
    parser.add_argument(
        "--x",
        choices=list(X_AXES),
        default="round",
        help=f"the plots' x axis: the round (default), wall_time (the running sum of {ROUND_TIME}), "
        f"sim_time ({CUMULATIVE['sim_time']}, the simulated clock: clock=sampled|trace) or "
        f"comm_mb ({CUMULATIVE['comm_mb']}, megabytes sent both ways) or epsilon ({CUMULATIVE['epsilon']}, "
        "the privacy budget spent)",
    )
    parser.add_argument(
        "--epsilon-budget",
        type=_budget,
        default=None,
        metavar="B",
        help="add a column: eval/accuracy of the last evaluated round with dp/epsilon <= B, mean ± std over seeds",
    )
    parser.add_argument(
        "--facet",
        default=None,
        metavar="KEY",
        help="one panel per value of the override KEY in every plot (e.g. strategy)",
    )
    parser.add_argument(
        "--grid",
        nargs=2,
        metavar=("ROWS", "COLS"),
        default=None,
        help="also a ROWS x COLS table of "
        "final eval/accuracy and each --metric (e.g. strategy attack) into grid.csv and grid.md",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table, write ``report.csv`` and ``accuracy.png``; exit status 2 when there are no runs."""
    args = parse_args(argv)
    root: Path = args.sweep_dir
    # every --metric is plotted too, per round (NAME of NAME:AGG)
    plots = list(dict.fromkeys([*(args.plot or [ACCURACY]), *(split_metric(m)[0] for m in args.metric)]))
    series = [name for plot in plots for name in fallback_names(plot)]  # every scalar of a fallback list
    runs = load_runs(root, series=series + ([ROUND_TIME] if args.x == "wall_time" else []))
    if not runs:
        print(f"{PROG}: no runs (metrics.jsonl or summary.json) under {root}", file=sys.stderr)
        return 2
    problem = (grid_problem(runs, args.grid) if args.grid else None) or (
        facet_problem(runs, args.facet) if args.facet else None
    )
    if problem:
        print(problem, file=sys.stderr)
        return 2
    groups = group_runs(runs)
    metrics = list(dict.fromkeys(args.metric))
    budget = args.epsilon_budget
    stats = [aggregate(config, members, args.target, metrics, budget) for config, members in groups.items()]
    print(format_table(stats, args.target, budget))
    for line in damaged_lines(runs, root):
        print(line)
    for line in unfinished_lines(runs, root):
        print(line)
    for name in metrics:
        if not any(logged_name(r, split_metric(name)[0]) for r in runs):
            print(f"{PROG}: no run logged {split_metric(name)[0]}")
    for line in fallback_lines(groups, [*plots, *(split_metric(m)[0] for m in metrics)]):
        print(line)
    if budget is not None and not any(r.epsilon for r in runs):
        print(f"{PROG}: no run logged {CUMULATIVE['epsilon']} ({UNLOGGED['epsilon'][0]}); no accuracy within ε")
    for line in unplotted_lines(runs, root, args.x) if args.x in CUMULATIVE else []:
        print(line)
    out: Path = args.out if args.out is not None else root
    out.mkdir(parents=True, exist_ok=True)
    write_csv(csv_rows(stats, args.target, budget), out / "report.csv")
    grids = report_grids(runs, args.grid, metrics, out) if args.grid else []
    written = [out / "report.csv", *grids] + write_plots(groups, out, plots, args.x, args.target, args.facet)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def write_plots(
    groups: dict[tuple[str, ...], list[Run]],
    out: Path,
    plots: Sequence[str],
    x: str,
    target: float | None,
    facet: str | None = None,
) -> list[Path]:
    """One PNG per name in ``plots`` (one panel per value of the override ``facet`` if given); says in one line
    why one was not drawn. The paths written."""
    names = [png_name(metric) for metric in plots]
    if not have_matplotlib():
        print(
            f"{PROG}: matplotlib is not installed (pip install 'fedsim-torch[plot]', in a source checkout "
            f"pip install -e '.[plot]', or pip install matplotlib); skipped {', '.join(names)}"
        )
        return []
    written = []
    for metric, name in zip(plots, names, strict=True):
        if plot_metric(groups, out / name, metric, x, target, facet and facet.lstrip("+~")):
            written.append(out / name)
        else:
            needed = {"wall_time": f" with {ROUND_TIME}", **{k: f" with {v}" for k, v in CUMULATIVE.items()}}.get(x, "")
            print(f"{PROG}: no run logged {metric}{needed}; skipped {name}")
    return written


if __name__ == "__main__":
    sys.exit(main())
