"""In-memory tensor datasets: the one data format that every executor and client works on.

Datasets are loaded once into two tensors (features and labels) so that a client's batch is a single
index operation — no per-sample Python, no DataLoader workers, and the tensors can be placed in shared
memory and handed to worker processes once per run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

ArrayLike = Any
"""A numpy array, a torch tensor or anything ``np.asarray`` takes."""


@dataclass(frozen=True)
class TensorData:
    """Features ``x`` (shape ``(N, *input_shape)``: float32, or int64 token ids for text models) and labels
    ``y`` (int64, shape ``(N,)``).

    ``groups`` optionally gives the natural owner of every example (e.g. the device of the FedProx
    Synthetic data); the ``natural`` partitioner uses it.
    """

    x: torch.Tensor
    y: torch.Tensor
    num_classes: int
    groups: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"TensorData: x has {self.x.shape[0]} rows but y has {self.y.shape[0]}")
        if self.groups is not None and len(self.groups) != len(self.y):
            raise ValueError(f"TensorData: groups has {len(self.groups)} entries but y has {len(self.y)}")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one example, e.g. ``(1, 28, 28)`` for MNIST or ``(60,)`` for Synthetic."""
        return tuple(self.x.shape[1:])

    @property
    def labels(self) -> np.ndarray:
        """Labels as a numpy array (what partitioners take)."""
        return self.y.numpy()


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
        """Your own arrays (numpy or torch) as a split; see :func:`fedsim.data.arrays.split_from_arrays`."""
        from fedsim.data.arrays import split_from_arrays

        return split_from_arrays(
            x_train, y_train, x_test, y_test,
            num_classes=num_classes, client_ids=client_ids, test_client_ids=test_client_ids,
        )

    @classmethod
    def from_pool(
        cls, x: ArrayLike, y: ArrayLike, *, client_ids: ArrayLike, test_mask: ArrayLike, num_classes: int | None = None
    ) -> DataSplit:
        """One pool of rows, each with its owner and whether it is in the owner's test part; no copy of the
        training rows. See :func:`fedsim.data.arrays.split_from_pool`."""
        from fedsim.data.arrays import split_from_pool

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
