"""In-memory tensor datasets: the one data format that every executor and client works on.

Datasets are loaded once into two tensors (features and labels) so that a client's batch is a single
index operation — no per-sample Python, no DataLoader workers, and the tensors can be placed in shared
memory and handed to worker processes once per run.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from fedsim.data.finite import check_finite

ArrayLike = Any
"""A numpy array, a torch tensor or anything ``np.asarray`` takes."""


@dataclass(frozen=True)
class TensorData:
    """Features ``x`` (shape ``(N, *input_shape)``: float32, or int64 token ids for text models) and labels
    ``y`` (int64, shape ``(N,)``; or ``(N, T)`` token labels of a language model's data, -100 where no loss is
    taken: :mod:`fedsim.data.instructions`).

    ``groups`` optionally gives the natural owner of every example (e.g. the device of the FedProx
    Synthetic data); the ``natural`` partitioner uses it. ``categories`` optionally gives every example a class id
    to partition by in place of ``y`` (e.g. the topic of an instruction: ``data.category_column``), so that
    ``dirichlet`` and ``shards`` work on token labels; training and evaluation never read it. ``vocab_size``
    optionally gives the number of token ids of ``x`` when the labels are not tokens (a text classifier's data: the
    tokenizer's vocabulary, which ``model.vocab_size=null`` takes); a language model's is ``num_classes``.
    """

    x: torch.Tensor
    y: torch.Tensor
    num_classes: int
    groups: np.ndarray | None = None
    categories: np.ndarray | None = None
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"TensorData: x has {self.x.shape[0]} rows but y has {self.y.shape[0]}")
        if self.groups is not None and len(self.groups) != len(self.y):
            raise ValueError(f"TensorData: groups has {len(self.groups)} entries but y has {len(self.y)}")
        if self.categories is not None and np.shape(self.categories) != (len(self.y),):
            raise ValueError(
                f"TensorData: categories has shape {np.shape(self.categories)} but y has {len(self.y)} rows"
            )

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one example, e.g. ``(1, 28, 28)`` for MNIST or ``(60,)`` for Synthetic."""
        return tuple(self.x.shape[1:])

    @property
    def labels(self) -> np.ndarray:
        """What partitioners take: ``categories`` when given, else the labels ``y`` as a numpy array."""
        return self.y.numpy() if self.categories is None else self.categories


@dataclass(frozen=True)
class DataSplit:
    """A dataset's training part (to be partitioned over clients) and its centralized test part.

    ``local_test`` is for data that comes with its own per-client split (LEAF's per-user train/test
    files): a boolean mask over ``train``'s rows, true for the rows in their owner's own test split.
    Those rows are usually the same examples as ``test`` (LEAF's test files are both), so loaders keep
    them as the last rows of ``train`` and make ``test`` a view of them: no copy. With
    ``partition=natural`` (or ``auto``) each owner's client tests on exactly its own rows; any other
    partitioner divides only the unmasked rows and splits them with ``client_test_fraction``.
    """

    train: TensorData
    test: TensorData
    local_test: np.ndarray | None = None

    @classmethod
    def from_arrays(
        cls,
        x_train: ArrayLike,
        y_train: ArrayLike,
        x_test: ArrayLike,
        y_test: ArrayLike,
        *,
        num_classes: int | None = None,
        client_ids: ArrayLike | None = None,
        test_client_ids: ArrayLike | None = None,
    ) -> DataSplit:
        """Your own arrays (numpy or torch) as a split; see :func:`split_from_arrays`."""
        return split_from_arrays(
            x_train,
            y_train,
            x_test,
            y_test,
            num_classes=num_classes,
            client_ids=client_ids,
            test_client_ids=test_client_ids,
        )

    @classmethod
    def from_pool(
        cls, x: ArrayLike, y: ArrayLike, *, client_ids: ArrayLike, test_mask: ArrayLike, num_classes: int | None = None
    ) -> DataSplit:
        """One pool of rows, each with its owner and whether it is in the owner's test part; no copy of the
        training rows. See :func:`split_from_pool`."""
        return split_from_pool(x, y, client_ids=client_ids, test_mask=test_mask, num_classes=num_classes)

    def __post_init__(self) -> None:
        if self.local_test is None:
            return
        mask = np.asarray(self.local_test)
        if mask.dtype != np.bool_ or mask.shape != (len(self.train),):
            raise ValueError(
                f"DataSplit: local_test must be a boolean mask with one entry per training row "
                f"({len(self.train)}), got dtype {mask.dtype} and shape {mask.shape}"
            )
        if self.train.groups is None:
            raise ValueError("DataSplit: local_test needs train.groups (the owner of every row)")


def _features(x: ArrayLike, name: str) -> torch.Tensor:
    """``x`` as float32 (no copy when it already is) or, for integer arrays, int64 token ids."""
    t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))
    if t.ndim < 2:
        raise ValueError(
            f"data: {name} must have one row per example and at least one feature column (got shape {tuple(t.shape)})"
        )
    if t.is_floating_point():
        return t.to(torch.float32)
    if t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"data: {name} must hold numbers (float features or integer token ids), got {t.dtype}")
    return t.to(torch.int64)


def _label_array(y: ArrayLike, name: str) -> np.ndarray:
    """``y`` as a 1-D numpy array (no copy when it is one)."""
    arr = y.numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
    if arr.ndim != 1:
        raise ValueError(f"data: {name} must be 1-D, one class index per example (got shape {arr.shape})")
    return arr


def _labels(arr: np.ndarray, name: str) -> torch.Tensor:
    """1-D labels as an int64 tensor; refuses fractional or negative labels."""
    if arr.dtype.kind == "f" and not np.array_equal(arr, np.round(arr)):
        raise ValueError(f"data: {name} must hold integer class indices (found fractional values)")
    if arr.dtype.kind not in "iuf" and arr.size:
        raise ValueError(
            f"data: {name} must hold integer class indices, got dtype {arr.dtype}; map labels to 0..C-1 first"
        )
    out = torch.from_numpy(np.ascontiguousarray(arr)).to(torch.int64)
    if out.numel() and int(out.min()) < 0:
        raise ValueError(f"data: {name} has a negative label ({int(out.min())}); labels must be 0..num_classes-1")
    return out


def _num_classes(y_train: torch.Tensor, y_test: torch.Tensor, num_classes: int | None) -> int:
    """``num_classes`` checked against the labels, or the largest label + 1 when not given."""
    largest = max((int(t.max()) for t in (y_train, y_test) if t.numel()), default=-1)
    if num_classes is None:
        return largest + 1
    if largest >= num_classes:
        raise ValueError(
            f"data: a label is {largest} but num_classes is {num_classes}; labels must be 0..num_classes-1"
        )
    return int(num_classes)


def _owners(ids: ArrayLike | None, rows: int, name: str) -> np.ndarray | None:
    """A 1-D owner array with one entry per row (or ``None``)."""
    if ids is None:
        return None
    arr = ids.numpy() if isinstance(ids, torch.Tensor) else np.asarray(ids)
    if arr.shape != (rows,):
        raise ValueError(f"data: {name} must have one entry per example ({rows}), got shape {arr.shape}")
    return arr


def split_from_arrays(
    x_train: ArrayLike,
    y_train: ArrayLike,
    x_test: ArrayLike,
    y_test: ArrayLike,
    *,
    num_classes: int | None = None,
    client_ids: ArrayLike | None = None,
    test_client_ids: ArrayLike | None = None,
    source: str | None = None,
    finite: Collection[str] = (),
) -> DataSplit:
    """A :class:`DataSplit` from arrays: ``client_ids`` names the owner of every training row (what
    ``partition=natural`` makes one client of); with ``test_client_ids`` as well, every owner also tests on
    its own test rows (:attr:`DataSplit.local_test`; the two parts are then copied into one pool, with the
    centralized test set a view of its tail). ``num_classes`` defaults to the largest label + 1.

    A NaN or infinite feature or label is refused in one line naming the array, its first such row, that row's
    owner and ``source`` (where the arrays were read, e.g. a file); see :func:`fedsim.data.finite.check_finite`.
    ``finite`` names the float32 numpy arrays (``x_train`` ...) that the caller already found finite, which are not
    read again (the ``.npz`` reader tests them while it reads them)."""
    xs = _features(x_train, "x_train"), _features(x_test, "x_test")
    raw = _label_array(y_train, "y_train"), _label_array(y_test, "y_test")
    for x, y, part in zip(xs, raw, ("train", "test"), strict=True):
        if x.shape[0] != y.shape[0]:
            raise ValueError(
                f"data: x_{part} has {x.shape[0]} rows but y_{part} has {y.shape[0]}; give one label per row"
            )
    if xs[0].shape[1:] != xs[1].shape[1:] or xs[0].dtype != xs[1].dtype:
        raise ValueError(
            f"data: x_train rows are {tuple(xs[0].shape[1:])} {xs[0].dtype} but x_test rows are "
            f"{tuple(xs[1].shape[1:])} {xs[1].dtype}; both must have the same shape and kind"
        )
    owners = _owners(client_ids, len(raw[0]), "client_ids")
    test_owners = _owners(test_client_ids, len(raw[1]), "test_client_ids")
    if test_owners is not None and owners is None:
        raise ValueError("data: test_client_ids needs client_ids too (the owner of every training row)")
    given = {"x_train": x_train, "x_test": x_test}
    for x, y, part, who in zip(xs, raw, ("train", "test"), (owners, test_owners), strict=True):
        if not _already_finite(given[f"x_{part}"], f"x_{part}", finite):
            check_finite(x, f"x_{part}", source=source, owners=who)
        check_finite(y, f"y_{part}", source=source, owners=who)
    ys = _labels(raw[0], "y_train"), _labels(raw[1], "y_test")
    classes = _num_classes(ys[0], ys[1], num_classes)
    if owners is None or test_owners is None:
        return DataSplit(TensorData(xs[0], ys[0], classes, owners), TensorData(xs[1], ys[1], classes))
    return _pooled(xs, ys, classes, owners, test_owners)


def _already_finite(given: ArrayLike, name: str, finite: Collection[str]) -> bool:
    """``name`` was found finite by the caller, and is the float32 numpy array used as it is (a conversion to float32
    could make a finite value infinite)."""
    return name in finite and isinstance(given, np.ndarray) and given.dtype == np.float32


def pooled_split(x: torch.Tensor, y: torch.Tensor, num_classes: int, groups: np.ndarray, n_train: int) -> DataSplit:
    """The pooled layout of a dataset with its own per-owner split (:class:`DataSplit`): the rows ``0..n_train-1``
    of ``x``/``y`` are the owners' training rows, the rest their test rows; ``groups`` names every row's owner.
    ``local_test`` marks the test rows and ``test`` is a view of them (no copy). The readers of LEAF, Hugging Face
    copies, text corpora and your own arrays all build their split with it."""
    mask = np.zeros(len(y), dtype=bool)
    mask[n_train:] = True
    test = TensorData(x[n_train:], y[n_train:], num_classes, groups[n_train:])
    return DataSplit(TensorData(x, y, num_classes, groups), test, local_test=mask)


def _pooled(
    xs: tuple[torch.Tensor, torch.Tensor],
    ys: tuple[torch.Tensor, torch.Tensor],
    classes: int,
    owners: np.ndarray,
    test_owners: np.ndarray,
) -> DataSplit:
    """Train rows then test rows in one pool (:func:`pooled_split`)."""
    return pooled_split(torch.cat(xs), torch.cat(ys), classes, np.concatenate([owners, test_owners]), len(ys[0]))


def split_from_pool(
    x: ArrayLike, y: ArrayLike, *, client_ids: ArrayLike, test_mask: ArrayLike, num_classes: int | None = None
) -> DataSplit:
    """A :class:`DataSplit` from ONE pool of rows that each belong to an owner (``client_ids``) and are either in
    that owner's training or its test part (``test_mask`` true): :meth:`DataSplit.from_arrays` with
    ``test_client_ids`` without its copy. Float32 features are used as they are; the centralized test set is a view
    when the test rows are the pool's last rows, else a copy of the test rows only. NaN or infinite values are
    refused as :meth:`DataSplit.from_arrays` says."""
    features, raw = _features(x, "x"), _label_array(y, "y")
    if features.shape[0] != raw.shape[0]:
        raise ValueError(f"data: x has {features.shape[0]} rows but y has {raw.shape[0]}; give one label per row")
    # both required: _owners gives None only for None
    owners = cast(np.ndarray, _owners(client_ids, len(raw), "client_ids"))
    mask = cast(np.ndarray, _owners(test_mask, len(raw), "test_mask"))
    if mask.dtype != np.bool_:
        raise ValueError(
            f"data: test_mask must be boolean (true: the row is in its owner's test part), got {mask.dtype}"
        )
    check_finite(features, "x", owners=owners)
    check_finite(raw, "y", owners=owners)
    labels = _labels(raw, "y")
    classes = _num_classes(labels, labels[:0], num_classes)
    test_rows = np.flatnonzero(mask)
    if test_rows.size and test_rows[0] == len(mask) - test_rows.size:  # the tail: a view
        cut = int(test_rows[0])
        test = TensorData(features[cut:], labels[cut:], classes, owners[cut:])
    else:
        index = torch.from_numpy(test_rows)
        test = TensorData(features[index], labels[index], classes, owners[test_rows])
    return DataSplit(TensorData(features, labels, classes, owners), test, local_test=mask)
