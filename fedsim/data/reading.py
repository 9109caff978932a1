"""What the dataset readers share (:mod:`fedsim.data.vision`, :mod:`~fedsim.data.leaf`, :mod:`~fedsim.data.hf`,
:mod:`~fedsim.data.instructions`, :mod:`~fedsim.data.text_corpus`, :mod:`~fedsim.data.synthetic` and the others):
the one-line messages their refusals are made of (a file that is not UTF-8 text, named with its line), and the
refusal of what cannot fit in memory.

A reader turns every problem with its input into one line that names the file (and the line, the user or the key)
and says what to do; these helpers are the parts of those lines that more than one reader writes. A generator whose
output size follows from its settings (:func:`fedsim.data.synthetic.memory_estimate`,
:func:`fedsim.data.synthetic_text.memory_estimate`) estimates its memory first and calls
:func:`refuse_beyond_memory` before it allocates anything. The pooled layout of a dataset with its own per-owner
split is :func:`fedsim.data.tensor_data.pooled_split`.
"""

from __future__ import annotations

import os
from pathlib import Path

from fedsim.core.errors import ConfigError


def one_line(text: object, limit: int = 300) -> str:
    """``text`` (a message, often another library's exception) with its lines joined by spaces and cut to ``limit``
    characters, to quote inside a reader's own one-line message."""
    joined = " ".join(line.strip() for line in str(text).splitlines() if line.strip())
    return joined if len(joined) <= limit else joined[: limit - 3] + "..."


def not_utf8(error: UnicodeDecodeError, path: str | Path, line: int | None = None) -> ValueError:
    """The one-line refusal of a text file that is not UTF-8, from the error of decoding its bytes: "``data: <path>
    line 3 is not UTF-8 text (byte 0xe9, the line's byte 12); re-encode the file as UTF-8 ...``". ``error.object``
    is the whole file (its line is counted from its newlines, 1-based), or the one ``line`` given."""
    data, start = bytes(error.object), error.start
    if line is None:
        line = data.count(b"\n", 0, start) + 1
        start -= data.rfind(b"\n", 0, start) + 1
    return ValueError(
        f"data: {path} line {line} is not UTF-8 text (byte 0x{error.object[error.start]:02x}, the line's byte "
        f"{start + 1}); re-encode the file as UTF-8, e.g. iconv -f latin1 -t utf-8 (if it is Latin-1)"
    )


def read_utf8(path: Path) -> str:
    """The whole file ``path`` as text; bytes that are not UTF-8 are refused in one line naming the file and the line
    (:func:`not_utf8`). The JSON Lines readers and the text corpora read their files with it."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise not_utf8(error, path) from None


def available_memory() -> int | None:
    """The bytes of memory the system can still give this process without swapping: Linux's ``MemAvailable``
    (``/proc/meminfo``), else the free physical pages that ``os.sysconf`` reports; ``None`` where the system tells
    neither (then :func:`refuse_beyond_memory` refuses nothing)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the file counts kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):  # not on every system (macOS has no SC_AVPHYS_PAGES)
        return None


def byte_size(count: float) -> str:
    """``count`` bytes in the largest binary unit that keeps the number at least 1: ``"2.4 GiB"``, ``"512 B"``."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    power = 0
    while abs(count) >= 1024 and power < len(units) - 1:
        count, power = count / 1024, power + 1
    return f"{count:.0f} B" if power == 0 else f"{count:.1f} {units[power]}"


def refuse_beyond_memory(setting: str, estimate: int, what: str, remedy: str, available: int | None = None) -> None:
    """Refuse, before a reader allocates anything, what cannot fit in memory: a one-line
    :class:`~fedsim.core.errors.ConfigError` "``<setting>: <what> need about <estimate> of memory (estimated from
    the settings), more than the <available> available; <remedy>``" when ``estimate`` (bytes) exceeds ``available``
    (default: :func:`available_memory`, read now). ``setting`` names the key and its value
    (``data.num_devices=...``)."""
    free = available_memory() if available is None else available
    if free is not None and estimate > free:
        raise ConfigError(
            f"{setting}: {what} need about {byte_size(estimate)} of memory (estimated from the settings), more than "
            f"the {byte_size(free)} available; {remedy}"
        )
