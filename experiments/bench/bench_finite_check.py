"""What the finite check of the data readers (fedsim/data/finite.py, issue #34) costs, against loading the data.

Issue #34's target: refusing NaN or infinite features "must cost at most 5 % of loading a 1-million-row dataset".
The data: ``--rows`` (1,000,000) training rows of ``--features`` float32 features (standard normal; every value
finite, so the check passes and only its cost is seen), int64 labels 0..9 and owners (1,000 clients), plus
``--rows // 10`` test rows, in one uncompressed ``.npz`` (``np.savez``) written once under ``--tmpdir``.

Timed: ``fedsim.data.arrays.npz(path=...)``, the real reader (``np.load`` reads every array, then
``split_from_arrays`` checks ``x_train``, ``y_train``, ``x_test`` and ``y_test``), ``with`` the check and
``without`` it (``check_finite`` replaced by a no-op in ``fedsim.data.tensor_data`` for that call), in turns: with,
without, without, with, ... so that a slower or faster stretch of a shared machine falls on both. Each pair's ratio is
(with) / (without); the median over the pairs is reported, with the median seconds.

On a shared machine two loads' times differ by more than the check costs, so ``with`` also times its check from the
inside: the seconds spent in ``check_finite`` during the load, as a share of that same load's seconds (``check
share``, median over the repeats), which no other job's stretch can fall between. The file was just written, so it is
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.data import tensor_data
from fedsim.data.arrays import npz
from fedsim.data.finite import check_finite

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


class _Timed:
    """``check_finite`` with the seconds spent in it added up."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        try:
            check_finite(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


@contextlib.contextmanager
def _check_replaced(check: Callable[..., None]) -> Iterator[None]:
    """``check`` instead of ``check_finite`` where the npz reader calls it (``split_from_arrays``)."""
    saved = tensor_data.check_finite
    tensor_data.check_finite = check
    try:
        yield
    finally:
        tensor_data.check_finite = saved


def _drop_from_page_cache(path: Path) -> None:
    """Make the next read of ``path`` come from the disk (this file's cached pages only)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _measure(path: Path, repeats: int, cold: bool) -> dict[str, list[float]]:
    """Seconds of ``repeats`` loads with the check and as many without (alternated), and each checked load's share
    spent in the check."""
    out: dict[str, list[float]] = {"with": [], "without": [], "share": []}
    for i in range(2 * repeats):
        with_check = i % 4 in (0, 3)  # with, without, without, with, ...
        timed = _Timed()
        gc.collect()
        if cold:
            _drop_from_page_cache(path)
        with _check_replaced(timed if with_check else _no_check):
            start = time.perf_counter()
            split = npz(path=path)
            seconds = time.perf_counter() - start
        out["with" if with_check else "without"].append(seconds)
        if with_check:
            out["share"].append(timed.seconds / seconds)
        del split
    return out


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
        f"{'rows x features':>18} {'file GB':>8} {'load s: without':>16} {'with':>7} "
        f"{'median ratio with/without':>26} {'(min..max)':>13} {'check share':>12}"
    )
    try:
        for features in (int(f) for f in args.features.split(",")):
            path = folder / f"rows{args.rows}_features{features}.npz"
            _write(path, args.rows, features)
            seconds = _measure(path, args.repeats, args.cold)
            ratios = [w / wo for w, wo in zip(seconds["with"], seconds["without"], strict=True)]
            print(
                f"{f'{args.rows:,} x {features}':>18} {path.stat().st_size / 1e9:>8.2f} "
                f"{statistics.median(seconds['without']):>16.3f} {statistics.median(seconds['with']):>7.3f} "
                f"{statistics.median(ratios):>26.3f} {f'{min(ratios):.2f}..{max(ratios):.2f}':>13} "
                f"{statistics.median(seconds['share']):>12.1%}",
                flush=True,
            )
            path.unlink()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
