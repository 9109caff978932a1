"""The federated view of a dataset: per-client train/test indices over one shared training set,
plus the centralized test set for server-side evaluation."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from fedsim.client.base import Client
from fedsim.core.progress import progress
from fedsim.data.local_split import split_train_test
from fedsim.data.partition import follows_groups
from fedsim.data.shares import Shares
from fedsim.data.tensor_data import DataSplit, TensorData

Partitioner = Callable[..., Sequence[np.ndarray]]
ClientFactory = Callable[..., Client]


@dataclass(frozen=True)
class FederatedData:
    """``client_train[i]`` / ``client_test[i]`` index ``train`` for client ``i``; ``test`` is centralized.

    :func:`federate` gives both as :class:`~fedsim.data.shares.Shares` (two arrays, not one per client); a list of
    arrays works too."""

    train: TensorData
    test: TensorData
    client_train: Sequence[np.ndarray]
    client_test: Sequence[np.ndarray]

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
    partitioner divides only the training rows and splits them with ``client_test_fraction``. Its time shows
    while it runs (:mod:`fedsim.core.progress`).
    """
    with progress(f"partitioning {len(split.train):,} rows", None, "step"):
        return _federate(split, partition, client_test_fraction, seed)


def _federate(split: DataSplit, partition: Partitioner, client_test_fraction: float, seed: int) -> FederatedData:
    """:func:`federate`."""
    if split.local_test is None:
        shares = partition(split.train.labels, seed=seed, groups=split.train.groups)
        client_train, client_test = split_train_test(shares, client_test_fraction, seed=seed)
        return FederatedData(split.train, split.test, client_train, client_test)
    mask = np.asarray(split.local_test)
    if follows_groups(partition):
        shares = Shares.of(partition(split.train.labels, seed=seed, groups=split.train.groups))
        client_train, client_test = _split_by_mask(shares, mask)
        assert split.train.groups is not None  # DataSplit refuses local_test without train.groups
        _check_every_client_trains(client_train, split.train.groups, shares)
        return FederatedData(split.train, split.test, client_train, client_test)
    rows = np.flatnonzero(~mask)
    groups = None if split.train.groups is None else split.train.groups[rows]
    local = Shares.of(partition(split.train.labels[rows], seed=seed, groups=groups))
    client_train, client_test = split_train_test(
        Shares(rows[local.flat], local.offsets), client_test_fraction, seed=seed
    )
    return FederatedData(split.train, split.test, client_train, client_test)


def _split_by_mask(shares: Shares, mask: np.ndarray) -> tuple[Shares, Shares]:
    """Every client's rows where ``mask`` is false (train) and true (test), each in the share's order."""
    is_test, owners = mask[shares.flat], shares.owners()
    num = len(shares)
    train = Shares.from_sizes(shares.flat[~is_test], np.bincount(owners[~is_test], minlength=num))
    return train, Shares.from_sizes(shares.flat[is_test], np.bincount(owners[is_test], minlength=num))


def _check_every_client_trains(client_train: Shares, groups: np.ndarray, shares: Shares) -> None:
    """Refuse, in one line, an owner whose rows are all in its own test split (it could not train)."""
    empty = np.flatnonzero(client_train.sizes == 0)
    if empty.size:
        owner = np.asarray(groups[shares[int(empty[0])][0]]).item()
        raise ValueError(
            f"data: {empty.size} client(s) have test rows but no training rows (first: owner {owner!r}); "
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


class Population(Sequence[Client]):
    """A federation's clients held as data: the client factory and every client's train/test indices.

    ``population[i]`` builds client ``i`` when it is asked for (``factory(client_id=i, train_indices=...,
    test_indices=...)``, as Flower's ``client_fn`` does), so a million devices cost two index arrays, not a million
    objects, and a worker process receives the population as those arrays. A client never changes during a run
    (:class:`~fedsim.client.base.Client`), so a fresh one per task trains exactly as a kept one would; two calls give
    equal but distinct objects. ``num_train`` is every client's training size without building any.
    """

    def __init__(self, factory: ClientFactory, train: Sequence[np.ndarray], test: Sequence[np.ndarray]) -> None:
        self.train, self.test = Shares.of(train), Shares.of(test)
        if len(self.train) != len(self.test):
            raise ValueError(f"Population: {len(self.train)} train shares but {len(self.test)} test shares")
        self.factory = factory

    @property
    def client_class(self) -> type[Client] | None:
        """The class of every client when the factory is a ``functools.partial`` of a class (Hydra's ``_target_`` with
        ``_partial_: true``, or the class itself), else ``None`` (a function may build different classes)."""
        func = self.factory.func if isinstance(self.factory, functools.partial) else self.factory
        return func if isinstance(func, type) and issubclass(func, Client) else None

    def representatives(self) -> Sequence[Client]:
        """One client per class for start-up checks of classes and class-wide settings: client 0 alone when
        :attr:`client_class` is known (every client shares it and the factory's settings), else every client."""
        if self.client_class is not None and len(self):
            return [self[0]]
        return self

    @property
    def num_train(self) -> np.ndarray:
        """Every client's number of training examples (``int64``), read from the indices."""
        cls = self.client_class
        if cls is not None and getattr(cls, "num_train", None) is Client.num_train:
            return self.train.sizes
        return np.fromiter((c.num_train for c in self), dtype=np.int64, count=len(self))

    def __len__(self) -> int:
        return len(self.train)

    @overload
    def __getitem__(self, index: int) -> Client: ...

    @overload
    def __getitem__(self, index: slice) -> list[Client]: ...

    def __getitem__(self, index: int | slice) -> Client | list[Client]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = int(index)
        if not -len(self) <= i < len(self):
            raise IndexError(f"client {index} out of range for {len(self)} clients")
        i %= len(self)
        return self.factory(client_id=i, train_indices=self.train[i], test_indices=self.test[i])

    def __iter__(self) -> Iterator[Client]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"Population({len(self)} clients of {self.factory!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Population, (self.factory, self.train, self.test))


def make_population(data: FederatedData, client_factory: ClientFactory) -> Population:
    """The clients of ``data`` as a :class:`Population`, each built by ``client_factory`` when it is asked for.

    Client 0 is built once here by ``client_factory`` itself, so that a wrong setting fails before any work (and
    Hydra's partial checks its target policy once); the population then builds clients from a plain partial of the
    same callable and arguments, as :func:`make_clients` does.
    """
    if data.num_clients:
        client_factory(client_id=0, train_indices=data.client_train[0], test_indices=data.client_test[0])
    return Population(_plain(client_factory), data.client_train, data.client_test)


def train_sizes(clients: Sequence[Client]) -> np.ndarray:
    """Every client's number of training examples, without building the clients of a :class:`Population`."""
    if isinstance(clients, Population):
        return clients.num_train
    return np.fromiter((c.num_train for c in clients), dtype=np.int64, count=len(clients))


def training_rows(clients: Sequence[Client]) -> np.ndarray:
    """Every client's ``train_indices``, concatenated in client order (``int64``): for a :class:`Population` whose
    :attr:`~Population.client_class` is known, its flat index array, without building a client (every client holds
    the indices the factory gave it); otherwise read from every client."""
    if isinstance(clients, Population) and clients.client_class is not None:
        return clients.train.flat
    if not len(clients):
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.asarray(c.train_indices, dtype=np.int64) for c in clients])


def representatives(clients: Sequence[Client]) -> Sequence[Client]:
    """The clients a start-up check of classes needs to see: :meth:`Population.representatives`, or all of them."""
    return clients.representatives() if isinstance(clients, Population) else clients


def _plain(factory: ClientFactory) -> ClientFactory:
    """``factory`` as a plain ``functools.partial`` when it is a partial of some subclass, else itself."""
    if isinstance(factory, functools.partial) and type(factory) is not functools.partial:
        return functools.partial(factory.func, *factory.args, **factory.keywords)
    return factory
