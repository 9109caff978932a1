"""Reading a device trace: one CSV row per client with its speed, bandwidths and daily online window.

The format is fedsim's own, a flattened form of what FedScale (Lai et al., "FedScale: Benchmarking Model and
System Performance of Federated Learning at Scale", ICML 2022) keeps per device: a compute speed (FedScale's
come from AI Benchmark measurements), up/down bandwidths (from MobiPerf) and availability (FedScale replays
on/off event traces; here each client has one online window a day)::

    # lines starting with '#' and blank lines are ignored
    client_id,examples_per_s,upload_mbps,download_mbps,online_start_h,online_hours
    0,120,2.5,25,22,8
    1,45,0.8,12,0,24

* The header line is required; its six columns may come in any order, and no others are allowed.
* ``client_id``: an integer ≥ 0, each at most once. Every client ``0 .. num_clients-1`` of the run needs a row;
  rows for higher ids are checked but ignored, so one trace serves runs of any smaller size.
* ``examples_per_s``: training examples the device processes per second (> 0).
* ``upload_mbps`` / ``download_mbps``: bandwidth client → server / server → client in Mbit/s (10⁶ bits per
  second, > 0); converted to bytes per second (× 125 000).
* ``online_start_h``: hour of the 24 h day at which the client comes online, in [0, 24) (fractions allowed);
  ``online_hours``: how long it stays online, in (0, 24]. A window may run past midnight (22 + 8 → until
  06:00); 24 means always online.

Files are read as UTF-8 (a byte-order mark, as spreadsheet exports write, is skipped). Values may be quoted;
whitespace around them is ignored. Every mistake is reported in one line naming the file, the line and the field.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

COLUMNS = ("client_id", "examples_per_s", "upload_mbps", "download_mbps", "online_start_h", "online_hours")
HEADER = ",".join(COLUMNS)
BYTES_PER_S_PER_MBPS = 1e6 / 8  # 1 Mbit/s = 125 000 bytes/s
SECONDS_PER_HOUR = 3600.0
HOURS_PER_DAY = 24.0
EXAMPLE = "experiments/sim/example_trace.csv"

_MEANING = {
    "examples_per_s": "training examples the device processes per second",
    "upload_mbps": "upload bandwidth in Mbit/s",
    "download_mbps": "download bandwidth in Mbit/s",
    "online_start_h": "hour of the day the client comes online, 0 <= h < 24",
    "online_hours": "hours a day the client is online, 0 < h <= 24 (24: always)",
}

Row = dict[str, float]


def _where(path: Path, line: int, field: str | None = None) -> str:
    """The common start of every message: which file, which line, which field."""
    return f"device trace {path} line {line}" + (f" field {field}" if field else "")


def _data_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, text)`` of every line that is not blank or a ``#`` comment."""
    if not path.is_file():
        raise FileNotFoundError(
            f"device trace {path} not found; give the path of a CSV with the header {HEADER} "
            f"and one row per client (example: {EXAMPLE})"
        )
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError as error:  # a binary file, or text in another encoding
        line = error.object[: error.start].count(b"\n") + 1
        raise ValueError(
            f"device trace {path} line {line}: byte 0x{error.object[error.start]:02x} is not UTF-8 text (a binary "
            f"file, or another encoding?); give a CSV trace saved as UTF-8 (format: fedsim/sim/trace.py; example: "
            f"{EXAMPLE})"
        ) from None
    except OSError as error:  # unreadable: permissions, a device that fails
        raise ValueError(f"device trace {path} cannot be read: {error.strerror or error}") from None
    return [(n, text) for n, text in enumerate(lines, start=1) if text.strip() and not text.lstrip().startswith("#")]


def _split(text: str) -> list[str]:
    return [value.strip() for value in next(csv.reader([text]))]


def _header(path: Path, line: int, text: str) -> list[str]:
    """The header's column names, checked: each of :data:`COLUMNS` exactly once and nothing else."""
    names = _split(text)
    for name in names:
        if name not in COLUMNS:
            raise ValueError(
                f"{_where(path, line)} (header): unknown column {name!r}; the header must name the "
                f"columns {HEADER} (any order), and the first line that is not a comment is the header"
            )
        if names.count(name) > 1:
            raise ValueError(
                f"{_where(path, line)} (header): column {name!r} appears twice; name each of {HEADER} once"
            )
    for name in COLUMNS:
        if name not in names:
            raise ValueError(
                f"{_where(path, line)} (header): column {name!r} is missing; the header must be {HEADER} (any order)"
            )
    return names


def _number(path: Path, line: int, field: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{_where(path, line, field)}: {text!r} is not a number; give the {_MEANING[field]}") from None
    if not math.isfinite(value):
        raise ValueError(f"{_where(path, line, field)}: {text!r} is not a finite number; give the {_MEANING[field]}")
    return value


def _client_id(path: Path, line: int, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(
            f"{_where(path, line, 'client_id')}: {text!r} is not a client id; "
            "give an integer >= 0 (clients are numbered 0 .. num_clients-1)"
        )
    return value


def _check_range(path: Path, line: int, field: str, value: float) -> None:
    """Speeds and bandwidths > 0; the online window inside the day."""
    if field == "online_start_h":
        ok = 0.0 <= value < HOURS_PER_DAY
    elif field == "online_hours":
        ok = 0.0 < value <= HOURS_PER_DAY
    else:
        ok = value > 0.0
    if not ok:
        bound = {"online_start_h": "in [0, 24)", "online_hours": "in (0, 24]"}.get(field, "> 0")
        raise ValueError(
            f"{_where(path, line, field)}: {value:g} is out of range, it must be {bound}; give the {_MEANING[field]}"
        )


def _row(path: Path, line: int, text: str, names: list[str]) -> tuple[int, Row]:
    """One client's row: its id and its five numbers, checked."""
    values = _split(text)
    if len(values) < len(names):
        raise ValueError(
            f"{_where(path, line, names[len(values)])}: missing (the row has {len(values)} values, the "
            f"header {len(names)}); give every column of {','.join(names)}"
        )
    if len(values) > len(names):
        raise ValueError(
            f"{_where(path, line)}: {len(values)} values but the header has {len(names)} columns "
            f"({','.join(names)}); remove the values after field {names[-1]}"
        )
    fields = dict(zip(names, values, strict=True))
    client = _client_id(path, line, fields.pop("client_id"))
    row = {}
    for field in COLUMNS[1:]:
        row[field] = _number(path, line, field, fields[field])
        _check_range(path, line, field, row[field])
    return client, row


def _rows(path: Path) -> dict[int, tuple[int, Row]]:
    """Every client row of the file, by client id, with its line number."""
    lines = _data_lines(path)
    if not lines:
        raise ValueError(
            f"device trace {path} line 1: the file is empty (or only comments); write the header "
            f"{HEADER} and one row per client (example: {EXAMPLE})"
        )
    header_line, header_text = lines[0]
    names = _header(path, header_line, header_text)
    if len(lines) == 1:
        raise ValueError(
            f"device trace {path} line {header_line}: the header is followed by no client rows; add one row per client"
        )
    rows: dict[int, tuple[int, Row]] = {}
    for line, text in lines[1:]:
        client, row = _row(path, line, text, names)
        if client in rows:
            raise ValueError(
                f"{_where(path, line, 'client_id')}: client {client} already has a row on line "
                f"{rows[client][0]}; give each client exactly one row"
            )
        rows[client] = (line, row)
    return rows


def _check_all_present(path: Path, rows: dict[int, tuple[int, Row]], num_clients: int) -> None:
    missing = [c for c in range(num_clients) if c not in rows]
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ValueError(
            f"device trace {path} field client_id: no row for client(s) {shown} (the run has "
            f"{num_clients} clients, 0..{num_clients - 1}); add one row for each"
        )


def read_trace(path: str | Path, num_clients: int) -> dict[str, np.ndarray]:
    """The profile arrays of clients ``0 .. num_clients-1`` read from the trace at ``path``, in profile units.

    Returns ``speed`` (examples/s), ``upload`` and ``download`` (bytes/s), ``online_start`` and ``online_length``
    (seconds of an 86 400 s day), each of shape ``(num_clients,)`` in client-id order.
    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` for anything wrong in it.
    """
    path = Path(path)
    rows = _rows(path)
    _check_all_present(path, rows, num_clients)

    def column(field: str) -> np.ndarray:
        return np.array([rows[c][1][field] for c in range(num_clients)], dtype=np.float64)

    day = HOURS_PER_DAY * SECONDS_PER_HOUR
    start = np.minimum(column("online_start_h") * SECONDS_PER_HOUR, np.nextafter(day, 0.0))  # < day after rounding
    return {
        "speed": column("examples_per_s"),
        "upload": column("upload_mbps") * BYTES_PER_S_PER_MBPS,
        "download": column("download_mbps") * BYTES_PER_S_PER_MBPS,
        "online_start": start,
        "online_length": np.minimum(column("online_hours") * SECONDS_PER_HOUR, day),
    }
