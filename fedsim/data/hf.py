"""Hugging Face ``datasets`` copies read offline, with one client per value of a named column.

Reads what ``datasets`` writes (https://huggingface.co/docs/datasets): a ``save_to_disk`` folder (a ``Dataset``
or a ``DatasetDict`` of splits, read with ``datasets.load_from_disk``), or parquet files: one file, a glob, or a
folder such as a clone of a Hub dataset repository (read with ``datasets.load_dataset("parquet", ...)``, which
names the splits after the files, e.g. ``data/train-00000-of-00003.parquet``; a file or glob is one split,
``train_split``). Nothing is fetched from the Hub (offline mode is on while reading); get the data on a machine
with internet, e.g. ``datasets.load_dataset("flwrlabs/femnist").save_to_disk("data/femnist_hf")``.

Presets: ``conf/data/femnist_hf.yaml`` (flwrlabs/femnist: ``image`` 28x28 grayscale, ``writer_id``,
``character`` 0..61) and ``conf/data/shakespeare_hf.yaml`` (flwrlabs/shakespeare: ``character_id`` = the
speaking role, ``x`` 80 characters, ``y`` the next character), the Hub copies of LEAF's FEMNIST and Shakespeare
(Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018); ``conf/data/hf.yaml`` for any other dataset.

* Features, labels: see :mod:`fedsim.data.hf_columns`. Images become ``(pixel / 255 - image_mean) / image_std``;
  the defaults (0, 1) give LEAF's own FEMNIST scale, pixel / 255 in [0, 1] with no shift (LEAF's JSON stores
  exactly these values and its CNN reads them as they are). Strings become LEAF character ids.
* ``groups`` (for ``partition=natural``) is the client column; ``num_classes`` is the ``ClassLabel``'s size,
  81 for character labels (Shakespeare), else (integer labels) the largest label + 1, unless given.
* Test data. Without ``test_split`` (the flwrlabs copies have only "train") every client's rows are split as
  LEAF's ``split_data.py`` does per user: ``max(1, floor((1 - test_fraction) * n))`` random rows train, the rest
  test (so a client with one row only trains), chosen by ``np.random.default_rng(seed)``. With ``test_split``,
  its rows are the test set; when they also carry the client column, every client tests on its own rows.
  Either way of per-client test rows gives the pooled layout of :class:`~fedsim.data.tensor_data.DataSplit`:
  training rows first, test rows last, ``local_test`` marking them, ``test`` a view of the tail.
* A NaN or infinite feature is refused in one line naming the split and path, the column, the row (its index in
  the split) and its client (:mod:`fedsim.data.finite`).
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsim.core.checks import within
from fedsim.core.errors import DatasetNotFoundError
from fedsim.core.extras import require
from fedsim.data.finite import check_finite
from fedsim.data.reading import one_line
from fedsim.data.tensor_data import DataSplit, TensorData, pooled_split

NEEDED_BY = "a Hugging Face dataset (data=hf, femnist_hf, shakespeare_hf)"
_SAVED_MARKERS = ("dataset_dict.json", "dataset_info.json", "state.json")
_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class _Columns:
    """Which columns to read and how (the loader's options)."""

    client: str
    feature: str
    label: str
    image_mean: Any
    image_std: Any
    text_length: int | None

    def read(
        self, ds: Any, rows: np.ndarray, where: str, owners: np.ndarray | None, *, check: bool = True
    ) -> tuple[torch.Tensor, np.ndarray, int | None]:
        """Features, labels and the ``ClassLabel`` size of ``rows`` (in that order); unless ``check`` is false, the
        features checked as :meth:`check` says."""
        from fedsim.data.hf_columns import read_features, read_labels  # needs pyarrow: after the datasets check

        x = read_features(
            ds,
            self.feature,
            rows,
            image_mean=self.image_mean,
            image_std=self.image_std,
            text_length=self.text_length,
            where=where,
        )
        if check:
            self.check(x, where, owners, rows)
        y, classes = read_labels(ds, self.label, rows, where)  # integer or character labels: always finite
        return x, y, classes

    def check(self, x: torch.Tensor, where: str, owners: np.ndarray | None, rows: np.ndarray | None = None) -> None:
        """Refuse a NaN or infinite feature, naming ``where``, the row (``rows[i]`` for row ``i`` of ``x``) and its
        client (``owners[i]``)."""
        check_finite(x, f"column {self.feature!r}", source=where, owners=owners, rows=rows)


def hf(
    *,
    path: str | Path,
    client_column: str,
    feature_column: str,
    label_column: str,
    train_split: str = "train",
    test_split: str | None = None,
    test_fraction: float = 0.1,
    seed: int,
    num_classes: int | None = None,
    image_mean: float | list[float] = 0.0,
    image_std: float | list[float] = 1.0,
    text_length: int | None = None,
    cache_dir: str | None = None,
    hub_id: str | None = None,
) -> DataSplit:
    """A ``datasets`` copy at ``path`` as a :class:`DataSplit` (see the module docstring).

    ``cache_dir`` is where ``datasets`` converts parquet files to Arrow once (default: its own cache,
    ``HF_DATASETS_CACHE``); ``save_to_disk`` folders are memory-mapped in place. ``hub_id`` (e.g.
    ``flwrlabs/femnist``) only names the source in the message for a missing ``path``.
    """
    if test_split is None:
        within("data.test_fraction", test_fraction, "(0, 1)", hint=": the share of each client's rows kept for testing")
    datasets = _import_datasets()
    where = os.path.expanduser(str(path))
    with _offline(datasets):
        splits = _open(datasets, where, train_split, cache_dir, hub_id)
    columns = _Columns(client_column, feature_column, label_column, image_mean, image_std, text_length)
    train = _split(splits, train_split, where, "train_split")
    _require_columns(
        train,
        {"client_column": client_column, "feature_column": feature_column, "label_column": label_column},
        f"split {train_split!r} of {where}",
    )
    if test_split is None:
        return _split_per_client(train, columns, test_fraction, seed, num_classes, f"split {train_split!r} of {where}")
    test = _split(splits, test_split, where, "test_split")
    _require_columns(
        test, {"feature_column": feature_column, "label_column": label_column}, f"split {test_split!r} of {where}"
    )
    if client_column in test.column_names:
        both = _concatenated(datasets, train, test, columns, where)
        here = f"splits {train_split!r}+{test_split!r} of {where}"
        owners = _owners(both, client_column, here)
        x, y, classes = columns.read(both, np.arange(len(both)), here, owners, check=False)
        for name, part in ((train_split, slice(0, len(train))), (test_split, slice(len(train), None))):
            columns.check(x[part], f"split {name!r} of {where}", owners[part])  # rows named within their split
        return _pooled(x, y, _num_classes(y, classes, num_classes, where), owners, len(train))
    return _separate(train, test, columns, num_classes, (train_split, test_split), where)


def _import_datasets() -> Any:
    """The ``datasets`` package, or a one-line error saying how to install it."""
    return require("datasets", NEEDED_BY, "hf")


@contextlib.contextmanager
def _offline(datasets: Any) -> Iterator[None]:
    """``datasets``' offline mode (``HF_DATASETS_OFFLINE=1``) while reading: no Hub request, ever; and no progress
    bars on stderr (fedsim logs its own line)."""
    config = datasets.config
    saved = {key: getattr(config, key) for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if hasattr(config, key)}
    for key in saved:
        setattr(config, key, True)
    bars = datasets.utils.logging.is_progress_bar_enabled()
    datasets.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(config, key, value)
        if bars:
            datasets.utils.logging.enable_progress_bar()


def _owners(ds: Any, column: str, where: str) -> np.ndarray:
    from fedsim.data.hf_columns import read_owners

    return read_owners(ds, column, where)


def _missing(where: str, hub_id: str | None) -> FileNotFoundError:
    """The one-line :class:`~fedsim.core.errors.DatasetNotFoundError` for a missing ``path``."""
    hub = hub_id or "<owner>/<name>"
    return DatasetNotFoundError(
        f"data: no Hugging Face dataset at {where} (data.path); on a machine with internet run "
        f"datasets.load_dataset('{hub}').save_to_disk('{where}') (or download the parquet files of "
        f"https://huggingface.co/datasets/{hub}) and copy them there"
    )


def _open(datasets: Any, where: str, train_split: str, cache_dir: str | None, hub_id: str | None) -> dict[str, Any]:
    """Every split at ``where`` by name."""
    if os.path.isdir(where) and any(os.path.isfile(os.path.join(where, m)) for m in _SAVED_MARKERS):
        loaded = _reading(lambda: datasets.load_from_disk(where), where)
        return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {train_split: loaded}
    if os.path.isdir(where):
        if not glob.glob(os.path.join(where, "**", "*.parquet"), recursive=True):
            markers = " / ".join(_SAVED_MARKERS)
            raise ValueError(
                f"data: {where} is neither a datasets save_to_disk folder (no {markers}) nor a "
                "folder of .parquet files; point data.path at one of those"
            )
        loaded = _reading(lambda: datasets.load_dataset("parquet", data_dir=where, cache_dir=cache_dir), where)
        return dict(loaded)
    files = sorted(glob.glob(where, recursive=True)) if _GLOB_CHARS & set(where) else [where] * os.path.isfile(where)
    if not files:
        raise _missing(where, hub_id)
    odd = [f for f in files if not f.endswith(".parquet")]
    if odd:
        raise ValueError(
            f"data: {odd[0]} is not a .parquet file; data.path must be a save_to_disk folder, "
            "or parquet files (one file, a folder or a glob)"
        )
    loaded = _reading(lambda: datasets.load_dataset("parquet", data_files={"train": files}, cache_dir=cache_dir), where)
    return {train_split: loaded["train"]}


def _reading(load: Callable[[], Any], where: str) -> Any:
    """``load()``, with any failure of ``datasets`` / Arrow turned into one line naming ``where``."""
    try:
        return load()
    except Exception as err:  # noqa: BLE001 - datasets raises many kinds; all mean "cannot read these files"
        raise ValueError(f"data: cannot read {where} with datasets ({type(err).__name__}: {one_line(err)})") from None


def _split(splits: dict[str, Any], name: str, where: str, option: str) -> Any:
    if name not in splits:
        raise ValueError(
            f"data: {where} has no split {name!r} (it has: {', '.join(sorted(splits))}); "
            f"set data.{option} to one of them"
        )
    if len(splits[name]) == 0:
        raise ValueError(f"data: split {name!r} of {where} has no rows")
    return splits[name]


def _require_columns(ds: Any, wanted: dict[str, str], where: str) -> None:
    """One line naming the first option whose column ``ds`` lacks, and the columns it has."""
    for option, column in wanted.items():
        if column not in ds.column_names:
            raise ValueError(
                f"data: {where} has no column {column!r} (data.{option}); its columns: {', '.join(ds.column_names)}"
            )


def local_test_rows(owners: np.ndarray, test_fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of the rows in their owner's test split: per owner with ``n`` rows, ``n - max(1,
    floor((1 - test_fraction) * n))`` rows drawn with ``np.random.default_rng(seed)`` (LEAF's per-user split)."""
    _, owner, counts = np.unique(owners, return_inverse=True, return_counts=True)
    owner = owner.ravel()
    train_rows = np.maximum(1, np.floor((1 - test_fraction) * counts + 1e-9)).astype(np.int64)
    order = np.lexsort((np.random.default_rng(seed).random(len(owner)), owner))
    starts = np.cumsum(counts) - counts
    rank = np.empty(len(owner), dtype=np.int64)
    rank[order] = np.arange(len(owner)) - starts[owner[order]]
    return rank < (counts - train_rows)[owner]


def _split_per_client(
    train: Any, columns: _Columns, test_fraction: float, seed: int, num_classes: int | None, where: str
) -> DataSplit:
    """The pooled split of one split's rows, every client keeping a share of its rows for testing."""
    owners = _owners(train, columns.client, where)
    in_test = local_test_rows(owners, test_fraction, seed)
    if not in_test.any():
        raise ValueError(
            f"data: {where}: no client has test rows (each has too few rows for test_fraction="
            f"{test_fraction}); raise data.test_fraction or give a test split (data.test_split)"
        )
    rows = np.concatenate([np.flatnonzero(~in_test), np.flatnonzero(in_test)])
    ordered = owners[rows]
    x, y, classes = columns.read(train, rows, where, ordered)
    return _pooled(x, y, _num_classes(y, classes, num_classes, where), ordered, int((~in_test).sum()))


def _pooled(x: torch.Tensor, y: np.ndarray, classes: int, owners: np.ndarray, n_train: int) -> DataSplit:
    """Training rows then test rows in one pool (:func:`~fedsim.data.tensor_data.pooled_split`)."""
    return pooled_split(x, torch.from_numpy(np.ascontiguousarray(y)), classes, owners, n_train)


def _concatenated(datasets: Any, train: Any, test: Any, columns: _Columns, where: str) -> Any:
    """The train rows then the test rows of the three columns, as one dataset (no copy)."""
    names = list(dict.fromkeys((columns.client, columns.feature, columns.label)))
    parts = [train.select_columns(names), test.select_columns(names)]
    return _reading(lambda: datasets.concatenate_datasets(parts), where)


def _separate(
    train: Any, test: Any, columns: _Columns, num_classes: int | None, names: tuple[str, str], where: str
) -> DataSplit:
    """Train split with owners, test split without (then the test set is only the server's)."""
    owners = _owners(train, columns.client, f"split {names[0]!r} of {where}")
    x, y, classes = columns.read(train, np.arange(len(train)), f"split {names[0]!r} of {where}", owners)
    x_test, y_test, test_classes = columns.read(test, np.arange(len(test)), f"split {names[1]!r} of {where}", None)
    declared = classes if test_classes is None else max(test_classes, classes or 0)
    total = _num_classes(np.concatenate([y, y_test]), declared, num_classes, where)
    return DataSplit(
        TensorData(x, torch.from_numpy(y), total, owners), TensorData(x_test, torch.from_numpy(y_test), total)
    )


def _num_classes(y: np.ndarray, from_feature: int | None, given: int | None, where: str) -> int:
    """``given``, else the ``ClassLabel`` size, else the largest label + 1; a label beyond it is refused."""
    largest = int(y.max()) if y.size else -1
    classes = given if given is not None else from_feature if from_feature is not None else largest + 1
    if largest >= classes:
        raise ValueError(
            f"data: {where}: a label is {largest} but num_classes is {classes}; "
            "labels must be 0..num_classes-1 (fix data.num_classes)"
        )
    return int(classes)
