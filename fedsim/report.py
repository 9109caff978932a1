"""Compare the runs of a sweep: ``python -m fedsim.report <sweep dir> [--target 0.6] [--out DIR]``.

Every directory under the sweep dir that holds a ``metrics.jsonl`` is a run, finished or not. Runs are
grouped into configurations by their Hydra overrides (``.hydra/overrides.yaml``, else the directory name)
without ``seed``; each configuration gets one table row and one ``report.csv`` row (seeds, final and best
test accuracy mean ± std over seeds, rounds to reach ``--target``, mean wall time) and one curve in
``accuracy.png`` (needs matplotlib: ``pip install fedsim[plot]``). Reads files only; no Hydra, no torch.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PROG = "fedsim.report"


@dataclass(frozen=True)
class Run:
    """One run directory, read back. ``curve`` holds ``(round, eval/accuracy)`` for evaluated rounds."""

    path: Path
    config: tuple[str, ...]  # sorted overrides without seed
    seed: str | None
    rounds: int  # last round logged
    curve: tuple[tuple[int, float], ...]
    finished: bool  # ended for good (see _finished)
    wall_time_s: float


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


def find_run_dirs(root: Path) -> list[Path]:
    """Every directory at or under ``root`` holding ``metrics.jsonl``, in job order (``2_`` before ``10_``)."""
    if not root.is_dir():
        return []
    return sorted((p.parent for p in root.rglob("metrics.jsonl")), key=lambda p: _natural(str(p.relative_to(root))))


def _natural(text: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``; a line still being written (or otherwise unreadable) is skipped."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "round" in record:
            records.append(record)
    return records


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


def load_run(run_dir: Path, root: Path) -> Run:
    """Read one run directory (``metrics.jsonl``, optional ``summary.json`` and ``.hydra/``)."""
    records = read_metrics(run_dir / "metrics.jsonl")
    config, seed = split_seed(run_overrides(run_dir, root))
    hydra_cfg = _read(run_dir / ".hydra" / "config.yaml", yaml.safe_load)
    hydra_cfg = hydra_cfg if isinstance(hydra_cfg, dict) else {}
    if seed is None and "seed" in hydra_cfg:
        seed = str(hydra_cfg["seed"])
    summary = _read(run_dir / "summary.json", json.loads)
    summary = summary if isinstance(summary, dict) else None
    rounds = max((int(r["round"]) for r in records), default=0)
    finished = _finished(summary, rounds, hydra_cfg.get("num_rounds"))
    curve = tuple((int(r["round"]), float(r["eval/accuracy"])) for r in records if r.get("eval/accuracy") is not None)
    if summary is not None and summary.get("wall_time_s") is not None:
        wall = float(summary["wall_time_s"])
    else:
        wall = sum(float(r["time/round_s"]) for r in records if r.get("time/round_s") is not None)
    return Run(run_dir, config, seed, rounds, curve, finished, wall)


def _finished(summary: dict[str, Any] | None, rounds: int, num_rounds: Any) -> bool:
    """Ended for good: ``summary.json`` says so (an early stop is finished, an interrupt is not); an older
    ``summary.json`` without ``finished`` counts when every configured round was logged."""
    if summary is None:
        return False
    if isinstance(summary.get("finished"), bool):
        return summary["finished"]
    return not isinstance(num_rounds, int) or rounds >= num_rounds


def load_runs(root: Path) -> list[Run]:
    """Every run under ``root`` (see :func:`find_run_dirs`)."""
    return [load_run(path, root) for path in find_run_dirs(root)]


def group_runs(runs: Sequence[Run]) -> dict[tuple[str, ...], list[Run]]:
    """Runs by configuration, configurations in order of their first run."""
    groups: dict[tuple[str, ...], list[Run]] = {}
    for run in runs:
        groups.setdefault(run.config, []).append(run)
    return groups


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (n - 1); std is ``None`` for fewer than two values."""
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def rounds_to_target(curve: Sequence[tuple[int, float]], target: float) -> int | None:
    """The first round whose test accuracy is at least ``target``; ``None`` if none is."""
    return next((round_num for round_num, acc in curve if acc >= target), None)


def aggregate(config: tuple[str, ...], runs: Sequence[Run], target: float | None = None) -> ConfigStats:
    """Summarise one configuration over its seeds. Unfinished runs count with what they have logged."""
    evaluated = [r for r in runs if r.curve]
    hits = [n for n in (rounds_to_target(r.curve, target) for r in runs) if n is not None] if target is not None else []
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
    )


def mean_curve(runs: Sequence[Run]) -> list[tuple[int, float, float, float]]:
    """``(round, mean, min, max)`` of test accuracy over the seeds that evaluated that round."""
    by_round: dict[int, list[float]] = {}
    for run in runs:
        for round_num, acc in run.curve:
            by_round.setdefault(round_num, []).append(acc)
    return [(n, statistics.fmean(v), min(v), max(v)) for n, v in sorted(by_round.items())]


def labels(configs: Sequence[tuple[str, ...]]) -> tuple[dict[tuple[str, ...], str], list[str]]:
    """Short names (the overrides that differ between configurations) and the overrides they all share."""
    common = sorted(set.intersection(*(set(c) for c in configs))) if len(configs) > 1 else []
    short = {c: ",".join(o for o in c if o not in common) or ",".join(c) or "(defaults)" for c in configs}
    return short, common


def _pm(pair: tuple[float | None, float | None]) -> str:
    mean, std = pair
    if mean is None:
        return "-"
    return f"{mean:.4f} ± {std:.4f}" if std is not None else f"{mean:.4f}"


def table_rows(stats: Sequence[ConfigStats], target: float | None) -> list[list[str]]:
    """The printed table as cells, header first."""
    short, _ = labels([s.config for s in stats])
    header = ["configuration", "seeds", "rounds", "final acc", "best acc"]
    header += [f"rounds to {target:g}"] if target is not None else []
    rows = [header + ["wall s"]]
    for s in stats:
        lo, hi = s.rounds
        row = [short[s.config], f"{s.finished}/{s.total}", f"{hi}" if lo == hi else f"{lo}-{hi}", _pm(s.final), _pm(s.best)]
        if target is not None:
            row.append(f"{s.to_target:g} ({s.reached}/{s.total})" if s.to_target is not None else f"- (0/{s.total})")
        rows.append(row + ["-" if s.wall_time_s is None else f"{s.wall_time_s:.1f}"])
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
    for s in stats:
        row: dict[str, Any] = {
            "configuration": ",".join(s.config), "seeds_finished": s.finished, "seeds_total": s.total,
            "rounds_min": s.rounds[0], "rounds_max": s.rounds[1],
            "final_accuracy_mean": s.final[0], "final_accuracy_std": s.final[1],
            "best_accuracy_mean": s.best[0], "best_accuracy_std": s.best[1],
        }
        if target is not None:
            row.update(target=target, rounds_to_target_mean=s.to_target, seeds_reached_target=s.reached)
        row["wall_time_s_mean"] = s.wall_time_s
        rows.append({k: "" if v is None else v for k, v in row.items()})
    return rows


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Write ``rows`` (same keys each) as CSV."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot_accuracy(groups: dict[tuple[str, ...], list[Run]], path: Path, target: float | None = None) -> bool:
    """Test accuracy per round for each configuration: mean over seeds, min-max band. ``False`` without matplotlib."""
    try:
        from matplotlib.figure import Figure  # no pyplot: leaves the caller's backend alone
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return False
    short, common = labels(list(groups))
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for config, runs in groups.items():
        points = mean_curve(runs)
        if not points:
            continue
        rounds, mean, low, high = zip(*points)
        (line,) = ax.plot(rounds, mean, label=f"{short[config]} ({len(runs)} seeds)")
        ax.fill_between(rounds, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="round", ylabel="eval/accuracy", title="test accuracy: mean over seeds, band min-max")
    ax.legend(fontsize="small", title=" ".join(common) or None, title_fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def unfinished_lines(runs: Sequence[Run], root: Path) -> list[str]:
    """One line per run that has not finished."""
    return [f"unfinished: {r.path.relative_to(root) if r.path != root else r.path} ({r.rounds} rounds logged"
            f"{'' if (r.path / 'summary.json').exists() else ', no summary.json'})" for r in runs if not r.finished]


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1 or math.isnan(value):
        raise argparse.ArgumentTypeError(f"must be an accuracy in (0, 1], got {text}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path, help="a Hydra multirun dir (or any dir holding run dirs)")
    parser.add_argument("--target", type=_fraction, default=None, help="report rounds to reach this test accuracy")
    parser.add_argument("--out", type=Path, default=None, help="where report.csv and accuracy.png go (default: sweep_dir)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table, write ``report.csv`` and ``accuracy.png``; exit status 2 when there are no runs."""
    args = parse_args(argv)
    root: Path = args.sweep_dir
    runs = load_runs(root)
    if not runs:
        print(f"{PROG}: no runs (metrics.jsonl) under {root}", file=sys.stderr)
        return 2
    groups = group_runs(runs)
    stats = [aggregate(config, members, args.target) for config, members in groups.items()]
    print(format_table(stats, args.target))
    for line in unfinished_lines(runs, root):
        print(line)
    out: Path = args.out if args.out is not None else root
    out.mkdir(parents=True, exist_ok=True)
    write_csv(csv_rows(stats, args.target), out / "report.csv")
    written = [out / "report.csv"]
    if plot_accuracy(groups, out / "accuracy.png", args.target):
        written.append(out / "accuracy.png")
    else:
        print(f"{PROG}: matplotlib is not installed (pip install 'fedsim[plot]'); skipped accuracy.png")
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
