"""Federated EMNIST (FEMNIST, one client per writer) from TensorFlow Federated's HDF5 files.

The writer split of EMNIST (Cohen et al., "EMNIST: an extension of MNIST to handwritten letters", 2017) used by
LEAF (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018) and published by TFF as
``tff.simulation.datasets.emnist.load_data`` (Reddi et al., "Adaptive Federated Optimization", ICLR 2021):

* ``fed_emnist_train.h5`` / ``fed_emnist_test.h5``: 62 classes (digits 0-9, then upper- and lower-case letters),
  from https://storage.googleapis.com/tff-datasets-public/fed_emnist.tar.bz2;
* ``fed_emnist_digitsonly_train.h5`` / ``..._test.h5`` (``only_digits=True``): 10 classes, from
  https://storage.googleapis.com/tff-datasets-public/fed_emnist_digitsonly.tar.bz2.

Extract the archive into ``root``. Each file holds one HDF5 group per writer, ``examples/<client_id>``, with
the datasets ``pixels`` (``(n, 28, 28)`` float32) and ``label`` (``(n,)`` integer). The test file has the same
writers: it is every writer's own test split. So the result uses fedsim's pooled layout (see
:class:`~fedsim.data.tensor_data.DataSplit`): all training rows, then all test rows, in ONE tensor; ``local_test``
marks the test rows and ``test`` is a zero-copy view of them. With ``partition=natural`` each writer is a client
that trains on its training rows and tests on its own test rows.

* ``x``: float32 ``(N, 1, 28, 28)``, the ``pixels`` values exactly as stored (TFF's 0..1 scale; not normalised).
* ``y``: int64 labels; ``groups``: int64, the index of the row's writer among all writer ids in sorted order
  (so client ``i`` of ``partition=natural`` is the ``i``-th writer id).

Memory: the rows of every writer are counted first, then read straight into the preallocated tensors
(``h5py``'s ``read_direct``), so the peak stays near the size of the raw arrays. A NaN or infinite pixel is refused
in one line naming the file, the writer and its row (:mod:`fedsim.data.finite`). Needs ``h5py``
(``pip install 'fedsim-torch[tff]'``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsim.core.errors import DatasetNotFoundError
from fedsim.core.extras import require
from fedsim.data.finite import check_finite
from fedsim.data.tensor_data import DataSplit, TensorData

TFF_SOURCES = {
    False: ("fed_emnist", "https://storage.googleapis.com/tff-datasets-public/fed_emnist.tar.bz2"),
    True: ("fed_emnist_digitsonly", "https://storage.googleapis.com/tff-datasets-public/fed_emnist_digitsonly.tar.bz2"),
}
"""``only_digits`` → (file stem, where TFF downloads the archive holding ``<stem>_{train,test}.h5``)."""

IMAGE_SHAPE = (28, 28)

_NAME = "data=femnist_tff"


def _h5py() -> Any:
    """The h5py module, or a one-line :class:`~fedsim.core.extras.MissingExtraError` saying how to install it."""
    return require("h5py", _NAME, "tff")


def _paths(root: str | Path, only_digits: bool) -> tuple[str, str]:
    """The train and test file paths; a one-line :class:`~fedsim.core.errors.DatasetNotFoundError` naming any
    that is missing."""
    stem, url = TFF_SOURCES[bool(only_digits)]
    base = os.path.expanduser(str(root))
    paths = tuple(os.path.join(base, f"{stem}_{part}.h5") for part in ("train", "test"))
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise DatasetNotFoundError(
            f"{_NAME}: no {' or '.join(missing)}; download {url} and extract it into {base} "
            f"(tar xjf {url.rsplit('/', 1)[1]} -C {base}), or set data.root to where the .h5 files are"
        )
    return paths[0], paths[1]


def _unreadable(path: str, only_digits: bool, err: BaseException) -> FileNotFoundError:
    """The one-line :class:`~fedsim.core.errors.DatasetNotFoundError` for a file that is not readable HDF5."""
    _, url = TFF_SOURCES[bool(only_digits)]
    detail = " ".join(str(err).split())[:200]
    return DatasetNotFoundError(
        f"{_NAME}: cannot read {path} as HDF5 (truncated or corrupt: {detail}); download {url} again and extract it"
    )


@contextlib.contextmanager
def _reading(path: str, only_digits: bool) -> Iterator[None]:
    """Turn h5py's OSError (not HDF5, truncated, a damaged block) into the one-line error naming ``path``."""
    try:
        yield
    except OSError as err:
        raise _unreadable(path, only_digits, err) from None


def _open_h5(h5py: Any, path: str, only_digits: bool) -> Any:
    """``h5py.File(path, "r")``, or the one-line error naming ``path``."""
    with _reading(path, only_digits):
        return h5py.File(path, "r")


def _writers(f: Any, path: str) -> list[tuple[str, int]]:
    """``(client_id, rows)`` of every writer in an open file, sorted by id; checks their datasets' shapes.
    No dataset stays open: thousands of open HDF5 datasets cost ~40 kB of memory each."""
    examples = f.get("examples")
    if examples is None:
        raise ValueError(
            f"{_NAME}: {path} has no 'examples' group; expected TFF's layout examples/<client_id>/{{pixels,label}}"
        )
    out = []
    for cid in sorted(examples):
        group = examples[cid]
        pixels, label = group.get("pixels"), group.get("label")
        for field, found in (("pixels", pixels), ("label", label)):
            if found is None:
                raise ValueError(f"{_NAME}: {path}: writer {cid!r} has no '{field}' dataset")
        rows = label.shape[0] if label.ndim == 1 else -1
        if rows < 0 or pixels.shape != (rows, *IMAGE_SHAPE):
            raise ValueError(
                f"{_NAME}: {path}: writer {cid!r} has pixels {pixels.shape} and label "
                f"{label.shape}; expected (n, 28, 28) and (n,)"
            )
        out.append((cid, rows))
    return out


def _fill(
    f: Any,
    path: str,
    writers: list[tuple[str, int]],
    start: int,
    code: dict[str, int],
    images: np.ndarray,
    labels: np.ndarray,
    groups: np.ndarray,
) -> None:
    """Read every writer's rows straight into ``images`` / ``labels`` (views of the pool) from row ``start`` on;
    a NaN or infinite (float) label is refused naming ``path``, the writer and its row."""
    examples = f["examples"]
    for cid, rows in writers:
        if rows:
            end = start + rows
            examples[f"{cid}/pixels"].read_direct(images[start:end])  # contiguous rows: no selection to build
            label = examples[f"{cid}/label"]
            if label.dtype.kind == "f":  # read as int64, a NaN would become an arbitrary number
                check_finite(label[()], "label", source=path, owners=cid)
            label.read_direct(labels[start:end])
            groups[start:end] = code[cid]
            start = end


def _check_pixels(x: torch.Tensor, path: str, writers: list[tuple[str, int]]) -> None:
    """Refuse a NaN or infinite pixel of one file's rows ``x`` (its writers' rows in order) in one line naming
    ``path``, the writer and the row in that writer's ``pixels``; one test of the whole file's rows."""
    starts = np.cumsum([0] + [rows for _, rows in writers])

    def writer(row: int) -> int:
        return int(np.searchsorted(starts, row, side="right")) - 1

    check_finite(
        x,
        "pixels",
        source=path,
        owners=lambda row: writers[writer(row)][0],
        rows=lambda row: row - int(starts[writer(row)]),
    )


def _check_labels(
    y: np.ndarray, num_classes: int, parts: list[tuple[str, list[tuple[str, int]]]], only_digits: bool
) -> None:
    """Refuse a label outside ``0..num_classes-1``, naming the file and writer of the first such row."""
    bad = np.flatnonzero((y < 0) | (y >= num_classes))
    if not bad.size:
        return
    row = int(bad[0])
    for path, writers in parts:
        for cid, rows in writers:
            if row < rows:
                hint = " (is this a 62-class file read with data.only_digits=true?)" if only_digits else ""
                raise ValueError(
                    f"{_NAME}: {path}: writer {cid!r} has label {int(y[bad[0]])}; labels must be "
                    f"0..{num_classes - 1}{hint}"
                )
            row -= rows


def femnist_tff(*, root: str | Path, only_digits: bool = False) -> DataSplit:
    """FEMNIST by writer from ``root/fed_emnist[_digitsonly]_{train,test}.h5``; see the module docstring.

    ``num_classes`` is 62, or 10 with ``only_digits``. Missing files raise a one-line
    :class:`~fedsim.core.errors.DatasetNotFoundError` naming the file and the archive to download;
    unreadable ones the same, naming the file; files in another layout a one-line ``ValueError``.
    """
    h5py = _h5py()
    paths = _paths(root, only_digits)
    num_classes = 10 if only_digits else 62
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(_open_h5(h5py, path, only_digits)) for path in paths]
        parts = []
        for path, f in zip(paths, files, strict=True):
            with _reading(path, only_digits):
                parts.append((path, _writers(f, path)))
        code = {cid: i for i, cid in enumerate(sorted({cid for _, ws in parts for cid, _ in ws}))}
        sizes = [sum(rows for _, rows in ws) for _, ws in parts]
        # zeros, not empty: pages touched here first are far cheaper than letting HDF5's reads fault them in
        # (on the 2-core VM of experiments/bench/bench_femnist_load.py: 2.2 GB read in 1 s instead of 11 s)
        x = torch.zeros((sum(sizes), 1, *IMAGE_SHAPE), dtype=torch.float32)
        y = torch.zeros(sum(sizes), dtype=torch.int64)
        groups = np.empty(sum(sizes), dtype=np.int64)
        images = x.numpy().reshape(-1, *IMAGE_SHAPE)  # a view: read_direct writes into x
        for f, (path, writers), start in zip(files, parts, (0, sizes[0]), strict=True):
            with _reading(path, only_digits):
                _fill(f, path, writers, start, code, images, y.numpy(), groups)
            _check_pixels(x[start : start + sum(rows for _, rows in writers)], path, writers)
    _check_labels(y.numpy(), num_classes, parts, only_digits)
    n = sizes[0]
    mask = np.zeros(len(y), dtype=bool)
    mask[n:] = True
    test = TensorData(x[n:], y[n:], num_classes, groups[n:])
    return DataSplit(TensorData(x, y, num_classes, groups), test, local_test=mask)
