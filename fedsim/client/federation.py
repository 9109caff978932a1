"""The federated view of a dataset: per-client train/test indices over one shared training set,
plus the centralized test set for server-side evaluation."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedsim.client.base import Client
from fedsim.data.local_split import split_train_test
from fedsim.data.partition import follows_groups
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
        """How many clients the data was partitioned into (one entry of ``client_train`` each)."""
        return len(self.client_train)


def federate(split: DataSplit, partition: Partitioner, *, client_test_fraction: float, seed: int) -> FederatedData:
    """Partition ``split.train`` over clients with ``partition(labels, seed=..., groups=...)`` and
    split every client's share into local train and test parts.

    Data with its own per-client split (``split.local_test``, e.g. LEAF) keeps it under a partitioner
    that follows the data's groups (``natural``, ``auto``): client ``i`` trains on its owner's training
    rows and tests on its owner's test rows, and ``client_test_fraction`` is not used. Any other
    partitioner divides only the training rows and splits them with ``client_test_fraction``.
    """
    if split.local_test is None:
        shares = partition(split.train.labels, seed=seed, groups=split.train.groups)
        client_train, client_test = split_train_test(shares, client_test_fraction, seed=seed)
        return FederatedData(split.train, split.test, client_train, client_test)
    mask = np.asarray(split.local_test)
    if follows_groups(partition):
        shares = partition(split.train.labels, seed=seed, groups=split.train.groups)
        client_train = [share[~mask[share]] for share in shares]
        client_test = [share[mask[share]] for share in shares]
        assert split.train.groups is not None  # DataSplit refuses local_test without train.groups
        _check_every_client_trains(client_train, split.train.groups, shares)
        return FederatedData(split.train, split.test, client_train, client_test)
    rows = np.flatnonzero(~mask)
    groups = None if split.train.groups is None else split.train.groups[rows]
    shares = [rows[share] for share in partition(split.train.labels[rows], seed=seed, groups=groups)]
    client_train, client_test = split_train_test(shares, client_test_fraction, seed=seed)
    return FederatedData(split.train, split.test, client_train, client_test)


def _check_every_client_trains(client_train: list[np.ndarray], groups: np.ndarray, shares: list[np.ndarray]) -> None:
    """Refuse, in one line, an owner whose rows are all in its own test split (it could not train)."""
    empty = [i for i, rows in enumerate(client_train) if rows.size == 0]
    if empty:
        owner = np.asarray(groups[shares[empty[0]][0]]).item()
        raise ValueError(
            f"data: {len(empty)} client(s) have test rows but no training rows (first: owner {owner!r}); "
            "remove them from the data files or use a partitioner other than natural"
        )


def make_clients(data: FederatedData, client_factory: ClientFactory) -> list[Client]:
    """One client per share: ``client_factory(client_id, train_indices, test_indices)``.

    The first client is built by ``client_factory`` itself; a factory that is a ``functools.partial`` (Hydra's
    ``_partial_: true`` makes one) builds the others as a plain partial of the same callable and arguments. Hydra's
    partial re-checks its target policy on every call (96 µs a client, 96 s for a million clients, issue #35); the
    first call has checked this target with these arguments, and the others differ only in the client's id and rows.
    """
    shares = list(zip(data.client_train, data.client_test, strict=True))
    if not shares:
        return []
    (train, test), rest = shares[0], shares[1:]
    clients = [client_factory(client_id=0, train_indices=train, test_indices=test)]
    factory = _plain(client_factory)
    clients += [factory(client_id=i, train_indices=train, test_indices=test) for i, (train, test) in enumerate(rest, 1)]
    return clients


def _plain(factory: ClientFactory) -> ClientFactory:
    """``factory`` as a plain ``functools.partial`` when it is a partial of some subclass, else itself."""
    if isinstance(factory, functools.partial) and type(factory) is not functools.partial:
        return functools.partial(factory.func, *factory.args, **factory.keywords)
    return factory
