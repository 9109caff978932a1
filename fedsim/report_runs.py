"""Reading a sweep's run directories back (for :mod:`fedsim.report`): ``metrics.jsonl``, ``summary.json``
and Hydra's ``.hydra/`` files of every run, finished or not. Files only; no Hydra, no torch."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class Run:
    """One run directory, read back. ``curve`` holds ``(round, eval/accuracy)`` for evaluated rounds;
    ``finals`` every scalar's value in the last round that logged it (NaN where that was ``null``)."""

    path: Path
    config: tuple[str, ...]  # sorted overrides without seed
    seed: str | None
    rounds: int  # last round logged
    curve: tuple[tuple[int, float], ...]
    finished: bool  # ended for good (see _finished)
    wall_time_s: float
    finals: dict[str, float] = field(default_factory=dict, hash=False)


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
    return Run(run_dir, config, seed, rounds, curve, finished, wall, final_scalars(records))


def final_scalars(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each scalar's value in the last record holding it; ``null`` (a non-finite value) reads as NaN.
    Non-numeric fields (``clients``) and ``round`` are left out."""
    finals: dict[str, float] = {}
    for record in records:
        for name, value in record.items():
            if value is None:
                finals[name] = math.nan
            elif isinstance(value, (int, float)) and not isinstance(value, bool) and name != "round":
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


def load_runs(root: Path) -> list[Run]:
    """Every run under ``root`` (see :func:`find_run_dirs`)."""
    return [load_run(path, root) for path in find_run_dirs(root)]
