"""What the finite check of the data readers (fedsim/data/finite.py, issue #34) costs, against loading the data.

Issue #34's target: refusing NaN or infinite features "must cost at most 5 % of loading a 1-million-row dataset".
The data: ``--rows`` (1,000,000) training rows of ``--features`` float32 features (standard normal; every value
finite, so the check passes and only its cost is seen), int64 labels 0..9 and owners (1,000 clients), plus
``--rows // 10`` test rows, in one uncompressed ``.npz`` (``np.savez``) written once under ``--tmpdir``.

Timed: ``fedsim.data.arrays.npz(path=...)``, the real reader, three ways (``_loading``): ``with`` the check as it
is (``read_npz`` tests the float32 arrays piece by piece on a second thread while it reads them,
``fedsim.data.npz_read``; ``split_from_arrays`` checks the rest); ``np.load``, the reader before issue #34 (``np.load``
of every array, no check); ``untested``, today's reader without any test (``read_npz``'s tester and ``check_finite``
replaced by no-ops). In rounds of one load of each kind, the order rotating every round, so that a slower or faster
stretch of a shared machine falls on all three. Reported: the median seconds of each kind, and the median (min..max)
over the rounds of (with) / (np.load) and of (with) / (untested): what the check costs against loading without it
as fedsim did, and against the same reader without the test.

The file was just written, so it is
read from the page cache (the check's worst case); with ``--cold`` its pages are dropped from the page cache before
every load (``posix_fadvise(DONTNEED)`` on this file only, after an ``fsync``), so each load reads the disk, as the
first load of a dataset does.

Run from the repository root (``--features 60,784`` needs about 3.5 GB free under --tmpdir and 8 GB of memory;
about 2 minutes on 2 cores)::

    .venv/bin/python experiments/bench/bench_finite_check.py --features 60,784 --repeats 11
    .venv/bin/python experiments/bench/bench_finite_check.py --features 60,784 --repeats 5 --cold
    .venv/bin/python experiments/bench/bench_finite_check.py --rows 100000 --repeats 3   # smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.data import arrays, npz_read, tensor_data
from fedsim.data.arrays import npz

CLIENTS = 1000
CHUNK_ROWS = 100_000


def _write(path: Path, rows: int, features: int, seed: int = 0) -> None:
    """The ``.npz`` of the module docstring, its features drawn in chunks (no float64 copy of the whole array)."""
    rng = np.random.default_rng(seed)
    data: dict[str, np.ndarray] = {}
    for part, n in (("train", rows), ("test", rows // 10)):
        x = np.empty((n, features), dtype=np.float32)
        for lo in range(0, n, CHUNK_ROWS):
            x[lo : lo + CHUNK_ROWS] = rng.standard_normal((min(CHUNK_ROWS, n - lo), features), dtype=np.float32)
        data[f"x_{part}"] = x
        data[f"y_{part}"] = np.arange(n, dtype=np.int64) % 10
    data["client_ids"] = np.arange(rows, dtype=np.int64) * CLIENTS // rows
    np.savez(path, **data)


def _no_check(*args: Any, **kwargs: Any) -> None:
    """The check removed: loading as before issue #34."""


def _np_load(path: str | Path) -> tuple[dict[str, np.ndarray], frozenset[str]]:
    """The npz reader before issue #34: ``np.load`` of every array, none tested."""
    with np.load(path, allow_pickle=False) as archive:
        return {key: archive[key] for key in archive.files}, frozenset()


class _Untested:
    """``read_npz``'s tester replaced: every piece accepted at once, on no thread."""

    def test(self, piece: np.ndarray) -> None:
        pass

    def result(self) -> bool:
        return False


@contextlib.contextmanager
def _loading(kind: str) -> Iterator[None]:
    """``with``: the reader as it is. ``np.load``: as before issue #34 (``np.load``, ``check_finite`` a no-op).
    ``untested``: ``read_npz`` without its test, ``check_finite`` a no-op (the reader's own cost, without the test)."""
    saved = tensor_data.check_finite, arrays.read_npz, npz_read._Tester
    if kind != "with":
        tensor_data.check_finite = _no_check
    if kind == "np.load":
        arrays.read_npz = _np_load
    if kind == "untested":
        npz_read._Tester = _Untested  # type: ignore[misc, assignment]
    try:
        yield
    finally:
        tensor_data.check_finite, arrays.read_npz, npz_read._Tester = saved  # type: ignore[misc]


KINDS = ("with", "np.load", "untested")


def _drop_from_page_cache(path: Path) -> None:
    """Make the next read of ``path`` come from the disk (this file's cached pages only)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _measure(path: Path, repeats: int, cold: bool) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall seconds and CPU seconds (every thread of this process: ``time.process_time``) of ``repeats`` loads of
    each kind, in rounds of one load each, the order rotating every round."""
    out: dict[str, list[float]] = {kind: [] for kind in KINDS}
    cpu: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for i in range(repeats):
        for kind in KINDS[i % 3 :] + KINDS[: i % 3]:
            gc.collect()
            if cold:
                _drop_from_page_cache(path)
            with _loading(kind):
                start, start_cpu = time.perf_counter(), time.process_time()
                split = npz(path=path)
                out[kind].append(time.perf_counter() - start)
                cpu[kind].append(time.process_time() - start_cpu)
            del split
    return out, cpu


def _row(clock: str, seconds: dict[str, list[float]]) -> str:
    """One clock's medians of each kind, the median (min..max) of the paired ratios of ``with``, and the ratio of the
    fastest loads of each kind (the least disturbed by anything else on the machine)."""
    medians = {kind: statistics.median(values) for kind, values in seconds.items()}
    ratios = {
        base: [w / b for w, b in zip(seconds["with"], seconds[base], strict=True)] for base in ("np.load", "untested")
    }
    shown = {base: f"{statistics.median(r):.3f} ({min(r):.2f}..{max(r):.2f})" for base, r in ratios.items()}
    fastest = {base: min(seconds["with"]) / min(seconds[base]) for base in ("np.load", "untested")}
    return (
        f"{clock:>5} {medians['np.load']:>10.3f} {medians['untested']:>11.3f} {medians['with']:>7.3f} "
        f"{shown['np.load']:>22} {shown['untested']:>22} {fastest['np.load']:>8.3f} {fastest['untested']:>8.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--features", default="60,784", help="comma-separated feature counts, one dataset each")
    parser.add_argument("--repeats", type=int, default=11, help="loads of each kind")
    parser.add_argument("--tmpdir", default=None, help="where the .npz files are written (deleted afterwards)")
    parser.add_argument("--cold", action="store_true", help="read the file from the disk at every load")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench_finite_", dir=args.tmpdir))
    print(
        f"{'rows x features':>18} {'file GB':>8} {'clock':>5} {'np.load s':>10} {'untested s':>11} {'with s':>7} "
        f"{'with / np.load':>22} {'with / untested':>22} {'fastest':>8} {'fastest':>8}"
    )
    try:
        for features in (int(f) for f in args.features.split(",")):
            path = folder / f"rows{args.rows}_features{features}.npz"
            _write(path, args.rows, features)
            wall, cpu = _measure(path, args.repeats, args.cold)
            for clock, seconds in (("wall", wall), ("cpu", cpu)):
                print(f"{f'{args.rows:,} x {features}':>18} {path.stat().st_size / 1e9:>8.2f} {_row(clock, seconds)}")
            path.unlink()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
