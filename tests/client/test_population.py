"""Clients as data (issue #35): ragged Shares equal today's lists of arrays, a Population builds each client as the
eager list did, and a run trains bitwise the same on a Population as on the list (serial and process)."""

from __future__ import annotations

import functools
import pickle
from typing import Any

import numpy as np
import pytest
import torch
from builders import tiny_server
from hydra.utils import instantiate
from omegaconf import OmegaConf

from fedsim.client.base import Client
from fedsim.client.federation import FederatedData, Population, federate, make_clients, make_population
from fedsim.data.local_split import _by_client_then_key, _test_counts, split_train_test
from fedsim.data.partition import auto, dirichlet, iid, natural
from fedsim.data.shares import Shares
from fedsim.data.synthetic import synthetic
from fedsim.data.tensor_data import DataSplit
from fedsim.executor import ProcessExecutor, SerialExecutor
from fedsim.executor.base import Executor
from fedsim.server.settings import Evaluation

# --- reference copies of the list-of-arrays code before issue #35 -----------------------------------------------


def _old_group_by_client(client_of: np.ndarray, values: np.ndarray, num_clients: int) -> list[np.ndarray]:
    order = np.argsort(client_of, kind="stable")
    counts = np.bincount(client_of, minlength=num_clients)
    return np.split(values[order].astype(np.int64, copy=False), np.cumsum(counts)[:-1])


def _old_natural(n: int, groups: np.ndarray) -> list[np.ndarray]:
    unique, client_of = np.unique(groups, return_inverse=True)
    return _old_group_by_client(client_of.ravel(), np.arange(n), len(unique))


def _old_split_train_test(
    indices: list[np.ndarray], test_fraction: float, *, seed: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    sizes = np.fromiter((len(part) for part in indices), dtype=np.int64, count=len(indices))
    flat = np.concatenate([np.asarray(part, dtype=np.int64).ravel() for part in indices])
    client_of = np.repeat(np.arange(len(indices)), sizes)
    keys = np.random.default_rng(seed).random(len(flat))
    order = np.lexsort((keys, client_of))
    starts = np.cumsum(sizes) - sizes
    rank = np.arange(len(flat)) - starts[client_of]
    is_test = rank < _test_counts(sizes, float(test_fraction))[client_of]
    shuffled = flat[order]
    test = _old_group_by_client(client_of[is_test], shuffled[is_test], len(indices))
    train = _old_group_by_client(client_of[~is_test], shuffled[~is_test], len(indices))
    return train, test


def _same(new: Any, old: list[np.ndarray]) -> None:
    """Same number of clients, and every client's array equal in values and dtype, in order."""
    assert len(new) == len(old)
    for got, want in zip(new, old, strict=True):
        assert got.dtype == want.dtype == np.int64 and np.array_equal(got, want)


# --- Shares -----------------------------------------------------------------------------------------------------

GROUPS = np.random.default_rng(5).integers(0, 40, size=700) * 3 + 7  # 40 owners (ids not 0..39), shuffled rows
LABELS = np.random.default_rng(6).integers(0, 4, size=700)


def test_natural_and_auto_give_todays_arrays_as_shares() -> None:
    want = _old_natural(700, GROUPS)
    for got in (natural(LABELS, seed=0, groups=GROUPS), auto(LABELS, seed=0, groups=GROUPS)):
        assert isinstance(got, Shares)
        _same(got, want)
        _same([got[i] for i in range(len(got))], want)  # indexing and iteration agree
        assert np.array_equal(got.sizes, [len(w) for w in want])


@pytest.mark.parametrize(
    "partition",
    [
        functools.partial(natural, groups=GROUPS),
        functools.partial(iid, num_clients=13),
        functools.partial(dirichlet, num_clients=9, alpha=0.5, min_size=5),
    ],
    ids=["natural", "iid", "dirichlet"],
)
@pytest.mark.parametrize("fraction", [0.0, 0.2, 0.5])
def test_split_train_test_gives_todays_arrays(partition: Any, fraction: float) -> None:
    shares = partition(LABELS, seed=4)
    old_train, old_test = _old_split_train_test(list(shares), fraction, seed=11)
    for given in (shares, list(shares)):  # Shares or a list in, the same arrays out
        train, test = split_train_test(given, fraction, seed=11)
        _same(train, old_train)
        _same(test, old_test)


def test_the_fast_order_is_lexsorts_also_where_keys_share_their_top_bits() -> None:
    client_of = np.repeat(np.arange(300), 7)
    keys = np.random.default_rng(2).random(len(client_of))
    assert np.array_equal(_by_client_then_key(client_of, keys), np.lexsort((keys, client_of)))
    keys[[10, 12]] = 0.5 + np.array([3, 1]) * 2.0**-53  # same top 32 bits, different keys: the lexsort decides
    keys[[15, 18]] = 0.25  # equal keys of one client: the row order decides
    assert np.array_equal(_by_client_then_key(client_of, keys), np.lexsort((keys, client_of)))


def test_shares_behave_like_the_list_of_arrays() -> None:
    parts = [np.array([4, 2], dtype=np.int64), np.zeros(0, dtype=np.int64), np.array([9], dtype=np.int64)]
    shares = Shares.of(parts)
    assert len(shares) == 3 and shares[-1].tolist() == [9] and shares[1].size == 0
    assert [p.tolist() for p in shares[:2]] == [[4, 2], []]
    assert [p.tolist() for p in shares + shares] == [[4, 2], [], [9]] * 2
    assert shares.owners().tolist() == [0, 0, 2]
    copy = pickle.loads(pickle.dumps(shares))
    _same(copy, parts)
    with pytest.raises(IndexError):
        shares[3]
    with pytest.raises(ValueError, match="offsets must rise"):
        Shares(np.arange(3), np.array([0, 2, 1, 3]))


# --- Population ---------------------------------------------------------------------------------------------------


class _SmoothClient(Client):
    """A user's client class with a setting of its own, as ``client._target_`` names it."""

    def __init__(self, *args: Any, smoothing: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.smoothing = smoothing


def _data() -> FederatedData:
    split = synthetic(num_devices=12, num_features=10, num_classes=5, min_size=30, max_size=60, seed=3)
    return federate(split, natural, client_test_fraction=0.2, seed=0)


def _settings(client: Client) -> dict[str, Any]:
    values = {k: v for k, v in vars(client).items() if k not in ("optimizer", "train_indices", "test_indices")}
    factory = client.optimizer
    values["optimizer"] = (factory.func, factory.args, factory.keywords)  # type: ignore[attr-defined]
    values["rows"] = (client.train_indices.tolist(), client.test_indices.tolist())
    values["class"] = type(client)
    return values


def test_population_builds_every_client_as_the_eager_list() -> None:
    node = OmegaConf.create(
        {
            "_target_": f"{__name__}._SmoothClient",
            "_partial_": True,
            "epochs": 2,
            "batch_size": 4,
            "smoothing": 0.1,
            "optimizer": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.05},
        }
    )
    data = _data()
    eager = make_clients(data, instantiate(node))
    population = make_population(data, instantiate(node))
    assert len(population) == len(eager) == 12 and population.client_class is _SmoothClient
    assert [_settings(c) for c in population] == [_settings(c) for c in eager]
    assert _settings(population[-1]) == _settings(eager[11])
    assert population.num_train.tolist() == [c.num_train for c in eager]
    shipped = pickle.loads(pickle.dumps(population))  # as a worker receives it: two Shares and the factory
    assert [_settings(c) for c in shipped] == [_settings(c) for c in eager]


def test_a_function_factory_is_called_per_client_asked_for() -> None:
    calls: list[int] = []

    def factory(*, client_id: int, train_indices: np.ndarray, test_indices: np.ndarray) -> Client:
        calls.append(client_id)
        return Client(client_id, train_indices, test_indices)

    population = make_population(_data(), factory)
    assert calls == [0]  # client 0, once, to check the settings before any work
    assert population.client_class is None and len(population.representatives()) == 12
    assert population[7].client_id == 7 and calls[-1] == 7


def test_a_wrong_setting_fails_when_the_population_is_made() -> None:
    with pytest.raises(ValueError, match="client.epochs"):
        make_population(_data(), functools.partial(Client, epochs=0))


# --- a run on a Population is the run on the list -----------------------------------------------------------------


def _final_params(clients: Any, data: FederatedData, executor: Executor) -> torch.Tensor:
    server = tiny_server(
        data,
        clients=clients,
        executor=executor,
        num_rounds=2,
        clients_per_round=5,
        seed=2,
        evaluation=Evaluation(every=2),
    )
    return server.run().params


@pytest.mark.parametrize("executor", ["serial", pytest.param("process", marks=pytest.mark.slow)])
def test_a_run_on_a_population_equals_the_run_on_the_list(executor: str) -> None:
    data = _data()
    factory = functools.partial(_SmoothClient, epochs=2, batch_size=8, smoothing=0.1)
    make = (lambda: SerialExecutor()) if executor == "serial" else (lambda: ProcessExecutor(devices="cpu", workers=2))
    on_list = _final_params(make_clients(data, factory), data, make())
    on_population = _final_params(make_population(data, factory), data, make())
    assert isinstance(make_population(data, factory), Population)
    assert torch.equal(on_list, on_population)


def test_local_test_rows_are_kept_per_owner_as_before() -> None:
    """Data with its own per-client split (LEAF's): each owner's train and test rows, in row order, as before."""
    split = synthetic(num_devices=6, num_features=4, num_classes=3, min_size=8, max_size=12, seed=1)
    assert split.train.groups is not None
    mask = np.random.default_rng(0).random(len(split.train.labels)) < 0.3
    mask[np.unique(split.train.groups, return_index=True)[1]] = False  # every owner keeps a training row
    local = DataSplit(split.train, split.test, local_test=mask)
    data = federate(local, natural, client_test_fraction=0.2, seed=0)
    shares = _old_natural(len(mask), np.asarray(split.train.groups))
    _same(data.client_train, [s[~mask[s]] for s in shares])
    _same(data.client_test, [s[mask[s]] for s in shares])
