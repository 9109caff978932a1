"""In-memory tensor datasets: the one data format that every executor and client works on.

Datasets are loaded once into two tensors (features and labels) so that a client's batch is a single
index operation — no per-sample Python, no DataLoader workers, and the tensors can be placed in shared
memory and handed to worker processes once per run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class TensorData:
    """Features ``x`` (float32, shape ``(N, *input_shape)``) and labels ``y`` (int64, shape ``(N,)``).

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
    """A dataset's training part (to be partitioned over clients) and its centralized test part."""

    train: TensorData
    test: TensorData
