"""The federated view of a dataset: per-client train/test indices over one shared training set,
plus the centralized test set for server-side evaluation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedsim.client import Client
from fedsim.data.local_split import split_train_test
from fedsim.data.tensor_data import DataSplit, TensorData

Partitioner = Callable[..., list[np.ndarray]]
ClientFactory = Callable[..., Client]


@dataclass(frozen=True)
class FederatedData:
    """``client_train[i]`` / ``client_test[i]`` index ``train`` for client ``i``; ``test`` is centralized."""

    train: TensorData
    test: TensorData
    client_train: list[np.ndarray]
    client_test: list[np.ndarray]

    @property
    def num_clients(self) -> int:
        return len(self.client_train)


def federate(split: DataSplit, partition: Partitioner, *, client_test_fraction: float, seed: int) -> FederatedData:
    """Partition ``split.train`` over clients with ``partition(labels, seed=..., groups=...)`` and
    split every client's share into local train and test parts."""
    shares = partition(split.train.labels, seed=seed, groups=split.train.groups)
    client_train, client_test = split_train_test(shares, client_test_fraction, seed=seed)
    return FederatedData(split.train, split.test, client_train, client_test)


def make_clients(data: FederatedData, client_factory: ClientFactory) -> list[Client]:
    """One client per share: ``client_factory(client_id, train_indices, test_indices)``."""
    return [
        client_factory(client_id=i, train_indices=train, test_indices=test)
        for i, (train, test) in enumerate(zip(data.client_train, data.client_test))
    ]
