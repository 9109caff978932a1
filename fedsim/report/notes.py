"""The notes ``python -m fedsim.report`` prints under its table: runs still running, failed, unfinished or damaged,
the scalar each configuration used from a fallback list, runs left out of a plot, and why ``--facet`` cannot split."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fedsim.report.plot import facet_key, labels
from fedsim.report.runs import CUMULATIVE, Run, along, fallback_names, logged_name

PROG = "fedsim.report"


def unfinished_lines(runs: Sequence[Run], root: Path) -> list[str]:
    """One line per run that has not finished: ``running: <dir> (<n> rounds logged so far)`` for a run whose process
    still holds its directory, ``failed: <dir> (<n> rounds logged): error: ...`` for a run stopped by an error, else
    ``unfinished: <dir> (<n> rounds logged[, no summary.json])``."""
    lines = []
    for r in runs:
        where = r.path.relative_to(root) if r.path != root else r.path
        if r.running:
            lines.append(f"running: {where} ({r.rounds} rounds logged so far)")
        elif r.failed:
            lines.append(f"failed: {where} ({r.rounds} rounds logged): {r.stop_reason}")
        elif not r.finished:
            lines.append(
                f"unfinished: {where} ({r.rounds} rounds logged"
                f"{'' if (r.path / 'summary.json').exists() else ', no summary.json'})"
            )
    return lines


def fallback_lines(groups: dict[tuple[str, ...], list[Run]], names: Sequence[str]) -> list[str]:
    """For each fallback list ``A,B`` in ``names`` whose configurations did not all use the same scalar, one line
    saying which scalar each used (``fedsim.report: eval_personal/accuracy_mean,eval/accuracy: eval/accuracy for
    strategy=fedavg; eval_personal/accuracy_mean for the other 1``)."""
    lines = []
    short, _ = labels(list(groups))
    for name in dict.fromkeys(n for n in names if "," in n):
        used: dict[str, list[str]] = {}
        for config, members in groups.items():
            for scalar in dict.fromkeys(logged_name(r, name) for r in members):
                if scalar is not None:
                    used.setdefault(scalar, []).append(short[config])
        if len(used) > 1:
            first, *others = sorted(used.items(), key=lambda item: fallback_names(name).index(item[0]))
            parts = [f"{scalar} for {', '.join(configs)}" for scalar, configs in others]
            lines.append(f"{PROG}: {name}: {'; '.join(parts)}; {first[0]} for the other {len(first[1])}")
    return lines


def damage(run: Run) -> str:
    """``K lines skipped`` of a damaged run's ``metrics.jsonl`` (``, not counted as finished`` added when its
    ``summary.json`` says finished but its last round is not among the usable rows)."""
    skipped = len(run.skipped)
    return f"{_count(skipped, 'line')} skipped" + (", not counted as finished" if run.uncounted else "")


def damaged_lines(runs: Sequence[Run], root: Path) -> list[str]:
    """One note per damaged ``metrics.jsonl``: ``fedsim.report: <run>/metrics.jsonl is damaged: skipped K of N
    lines (line 4: not JSON; line 9: cut short); read the run from the other M`` (and ``; not counted as
    finished: ...`` when its last round is not among them)."""
    lines = []
    for r in runs:
        if not r.damaged:
            continue
        where = (r.path.relative_to(root) if r.path != root else r.path) / "metrics.jsonl"
        kinds = dict.fromkeys(why for _, why in r.skipped)  # in the order they first occur
        which = "; ".join(f"{_numbers([n for n, w in r.skipped if w == kind])}: {kind}" for kind in kinds)
        kept = r.lines - len(r.skipped)
        line = f"{PROG}: {where} is damaged: skipped {len(r.skipped)} of {_count(r.lines, 'line')} ({which}); " + (
            f"read the run from the other {kept}" if kept else "no line is left to read the run from"
        )
        lines.append(line + (f"; not counted as finished: {r.uncounted}" if r.uncounted else ""))
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _numbers(numbers: Sequence[int], shown: int = 3) -> str:
    """``line 4``, ``lines 4, 7``, ``lines 4, 7, 9 and 2 more``."""
    more = f" and {len(numbers) - shown} more" if len(numbers) > shown else ""
    return f"line{'' if len(numbers) == 1 else 's'} {', '.join(str(n) for n in numbers[:shown])}{more}"


UNLOGGED = {  # per running total: why no run logged it, and why one run did not
    "sim_time": ("run with clock=sampled or clock=trace", "no clock"),
    "comm_mb": ("runs written before fedsim counted bytes", "written before fedsim counted bytes"),
    "epsilon": ("run with differential privacy, dp=central or dp=adaptive", "no DP"),
}


def unplotted_lines(runs: Sequence[Run], root: Path, x: str) -> list[str]:
    """For ``--x sim_time``, ``--x comm_mb`` or ``--x epsilon``: one line per run that logged rounds but not the
    running total (``sim/time_s``, ``comm/mb_total``, ``dp/epsilon``; left out of the plots); a single line when no
    run did."""
    name, (hint, why) = CUMULATIVE[x], UNLOGGED[x]
    if not any(along(r, x) for r in runs):
        return [f"{PROG}: no run logged {name} ({hint}); nothing to plot against {x}"]
    return [
        f"{PROG}: {r.path.relative_to(root) if r.path != root else r.path} logged no {name} ({why}); "
        f"left out of the {x} plots"
        for r in runs
        if r.rounds and not along(r, x)
    ]


def unclocked_lines(runs: Sequence[Run], root: Path) -> list[str]:
    """:func:`unplotted_lines` for ``--x sim_time``."""
    return unplotted_lines(runs, root, "sim_time")


def facet_problem(runs: Sequence[Run], key: str) -> str | None:
    """Why ``--facet KEY`` cannot split ``runs`` (one line), or ``None`` when it can."""
    key = key.lstrip("+~")
    if key == "seed":
        return f"{PROG}: --facet cannot use seed: a curve is the mean over the seeds"
    known = sorted({facet_key(o) for r in runs for o in r.config})
    if key not in known:
        return f"{PROG}: --facet: no run overrides {key} (the runs' keys: {', '.join(known) or 'none'})"
    return None
