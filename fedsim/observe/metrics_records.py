"""The records of ``metrics.jsonl``: reading them back, and the per-client rows that checkpoints leave out.

A round's record holds its scalars and, under ``"clients"``, one row per trained client. Checkpoints keep the
history without those rows (they would grow with rounds × clients); a resumed run takes them back from the
interrupted run's ``metrics.jsonl`` (:meth:`fedsim.observe.run_logger.RunLogger.restore`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def without_client_rows(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history as checkpoints keep it: every round's scalars, without its ``clients`` rows."""
    return [{k: v for k, v in record.items() if k != "clients"} for record in history]


def read_records(path: Path) -> dict[int, dict[str, Any]]:
    """The records of a ``metrics.jsonl`` by round; missing file, or a line cut short by a kill: skipped."""
    records: dict[int, dict[str, Any]] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return records
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("round"), int):
            records[record["round"]] = record
    return records


def add_client_rows(history: list[dict[str, Any]], earlier: dict[int, dict[str, Any]]) -> int:
    """Put back each record's ``clients`` from ``earlier`` where the scalars agree; how many were not found."""
    missing = 0
    for record in history:
        if "clients" in record:
            continue  # a checkpoint from before the rows were left out
        found = earlier.get(record["round"])
        if found is not None and without_client_rows([found])[0] == record:
            if "clients" in found:
                record["clients"] = found["clients"]
        else:
            missing += 1
    return missing
