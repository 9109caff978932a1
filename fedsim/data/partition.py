"""Partitioners: how a training set is divided among simulated clients.

Every partitioner is a pure function of the labels and a seed. It returns one ``int64`` numpy array
of example indices per client, and every index ``0..N-1`` appears in exactly one of them. All
partitioners share the call shape ``fn(labels, seed=..., groups=...)`` once their own parameters
are bound (``functools.partial`` or Hydra ``_partial_: true``); ``groups`` is ignored by all but
:func:`natural`. Randomness comes only from ``np.random.default_rng(seed)``.

Schemes and their sources:

* :func:`iid` — uniform random split, the IID baseline.
* :func:`shards` — the "pathological non-IID" split of McMahan et al., "Communication-Efficient
  Learning of Deep Networks from Decentralized Data", AISTATS 2017: sort by label, cut into shards,
  deal each client a few shards.
* :func:`dirichlet` — label-distribution skew of Hsu, Qi & Brown, "Measuring the Effects of
  Non-Identical Data Distribution for Federated Visual Classification", 2019. As in the widely used
  implementation of Yurochkin et al. (ICML 2019) and Li et al.'s NIID-Bench (ICDE 2022), each class
  is divided over the clients by proportions drawn from ``Dir(alpha)``; smaller ``alpha`` means more
  skew.
* :func:`lognormal` — quantity skew: client sizes proportional to lognormal draws, labels IID (the
  "unbalanced" setting of NIID-Bench, Li et al. 2022).
* :func:`auto` — :func:`natural` when the data has groups, else :func:`iid` (the default).
* :func:`natural` — one client per natural group of the data (e.g. the devices of the FedProx
  Synthetic data, Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020).

:func:`fedsim.data.local_split.split_train_test` further splits each client's indices into local train and test parts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedsim.core.checks import integer, is_integer, number
from fedsim.data.shares import Shares

Partition = list[np.ndarray]

DIRICHLET_MAX_DRAWS = 200
"""How many times :func:`dirichlet` redraws before giving up on ``min_size``."""

_NATURAL_NEEDS_GROUPS = (
    "partition=natural needs a dataset with natural clients (data=synthetic, femnist, shakespeare, sent140, celeba, "
    "femnist_tff, the Hugging Face copies, or npz with client_ids); use partition=iid, dirichlet, shards or lognormal"
)


# --------------------------------------------------------------------------------------------------
# validation helpers


def as_labels(labels: np.ndarray) -> np.ndarray:
    """Labels as a 1-D numpy array (accepts anything ``np.asarray`` does, e.g. a CPU tensor); one line saying what
    to do for 2-D token labels. Shared with :func:`fedsim.data.pachinko.pachinko`."""
    arr = np.asarray(labels)
    if arr.ndim == 2:
        raise ValueError(
            f"partition: this partitioner needs one class label per example, but the data has token labels of shape "
            f"{arr.shape}; set data.category_column to a field of the rows to split by (data=jsonl_instructions), or "
            "use partition=iid, lognormal or natural (with the data's user column)"
        )
    if arr.ndim != 1:
        raise ValueError(f"partition: labels must be 1-D (got shape {arr.shape})")
    return arr


def _count(labels: np.ndarray) -> int:
    """How many examples ``labels`` describes: one class label each (1-D) or one label per token (2-D), for the
    partitioners that do not read classes."""
    arr = np.asarray(labels)
    if arr.ndim not in (1, 2):
        raise ValueError(f"partition: labels must be 1-D, or 2-D token labels (got shape {arr.shape})")
    return len(arr)


def check_num_clients(num_clients: object, n: int) -> int:
    """``num_clients`` as an ``int`` when it is an integer between 1 and ``n`` (the training examples); else one line
    naming ``partition.num_clients``. Shared with :func:`fedsim.data.pachinko.pachinko`."""
    if not is_integer(num_clients) or not 1 <= num_clients <= n:
        raise ValueError(f"partition.num_clients must be between 1 and the {n} training examples (got {num_clients!r})")
    return int(num_clients)


def _check_min_size_fits(min_size: int, num_clients: int, n: int) -> None:
    if min_size * num_clients > n:
        raise ValueError(
            f"partition.min_size × num_clients must be ≤ the {n} training examples "
            f"(got {min_size} × {num_clients} = {min_size * num_clients})"
        )


# --------------------------------------------------------------------------------------------------
# shared machinery


def _group_by_client(client_of: np.ndarray, values: np.ndarray, num_clients: int) -> Partition:
    """Split ``values`` by the client id in the aligned array ``client_of`` (order kept per client)."""
    order = np.argsort(client_of, kind="stable")
    counts = np.bincount(client_of, minlength=num_clients)
    return np.split(values[order].astype(np.int64, copy=False), np.cumsum(counts)[:-1])


def _group_shares(client_of: np.ndarray, values: np.ndarray, num_clients: int) -> Shares:
    """:func:`_group_by_client` as :class:`~fedsim.data.shares.Shares`: the same arrays, without one object each."""
    order = np.argsort(client_of, kind="stable")
    counts = np.bincount(client_of, minlength=num_clients)
    return Shares.from_sizes(values[order].astype(np.int64, copy=False), counts)


def _split_by_sizes(indices: np.ndarray, sizes: np.ndarray) -> Partition:
    """Cut ``indices`` into consecutive pieces of the given sizes (which sum to its length)."""
    return np.split(indices.astype(np.int64, copy=False), np.cumsum(sizes)[:-1])


# --------------------------------------------------------------------------------------------------
# partitioners


def iid(labels: np.ndarray, *, num_clients: int, seed: int, groups: np.ndarray | None = None) -> Partition:
    """Shuffle all examples and deal them out; client sizes differ by at most one.

    The first ``N % num_clients`` clients get the extra example. Indices within a client are in
    shuffled order.
    """
    n = _count(labels)
    num_clients = check_num_clients(num_clients, n)
    perm = np.random.default_rng(seed).permutation(n)
    return [part.astype(np.int64, copy=False) for part in np.array_split(perm, num_clients)]


def _dirichlet_draw(
    labels: np.ndarray, classes: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """One draw: per class, shuffle its examples and cut them by ``Dir(alpha)`` proportions.

    Returns ``(indices, client_of)``, two aligned arrays covering every example once.
    """
    all_idx, all_owner = [], []
    for cls in classes:
        idx = rng.permutation(np.flatnonzero(labels == cls))
        props = rng.dirichlet(np.full(num_clients, alpha))
        cuts = (np.cumsum(props) * len(idx)).astype(np.int64)
        cuts[-1] = len(idx)  # guard against cumsum rounding to just below 1
        counts = np.diff(cuts, prepend=0)
        all_idx.append(idx)
        all_owner.append(np.repeat(np.arange(num_clients), counts))
    return np.concatenate(all_idx), np.concatenate(all_owner)


def dirichlet(
    labels: np.ndarray,
    *,
    num_clients: int,
    alpha: float,
    min_size: int = 10,
    seed: int,
    groups: np.ndarray | None = None,
) -> Partition:
    """Label skew: every class is split over the clients by proportions drawn from ``Dir(alpha)``.

    The whole draw is repeated (from the same generator, so still deterministic in ``seed``) until
    every client holds at least ``min_size`` examples; after ``DIRICHLET_MAX_DRAWS`` failed draws a
    ``ValueError`` says which parameter to change. Small ``alpha`` (e.g. 0.1) gives clients that hold
    few classes; large ``alpha`` (e.g. 100) approaches IID.
    """
    labels = as_labels(labels)
    n = len(labels)
    num_clients = check_num_clients(num_clients, n)
    alpha = number("partition.alpha", alpha, above=0)
    min_size = integer("partition.min_size", min_size, 0)
    _check_min_size_fits(min_size, num_clients, n)
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _ in range(DIRICHLET_MAX_DRAWS):
        idx, owner = _dirichlet_draw(labels, classes, num_clients, alpha, rng)
        if np.bincount(owner, minlength=num_clients).min() >= min_size:
            return _group_by_client(owner, idx, num_clients)
    raise ValueError(
        f"partition=dirichlet found no split giving all {num_clients} clients ≥ {min_size} of the "
        f"{n} examples in {DIRICHLET_MAX_DRAWS} draws (alpha={alpha}); raise partition.alpha or "
        "lower partition.min_size or partition.num_clients"
    )


def shards(
    labels: np.ndarray,
    *,
    num_clients: int,
    shards_per_client: int = 2,
    seed: int,
    groups: np.ndarray | None = None,
) -> Partition:
    """Pathological non-IID split: each client gets ``shards_per_client`` label-sorted shards.

    Examples are sorted by label (stable sort after a seeded shuffle, so ties are broken randomly),
    then cut into ``num_clients * shards_per_client`` contiguous shards whose sizes differ by at
    most one (the remainder of ``N / shards`` is spread evenly, so every example is used). The
    shards are dealt to clients in a random order. With balanced classes and shards that do not
    straddle a class boundary, a client sees at most ``shards_per_client`` labels.
    """
    labels = as_labels(labels)
    n = len(labels)
    num_clients = check_num_clients(num_clients, n)
    per_client = integer("partition.shards_per_client", shards_per_client, 1)
    num_shards = num_clients * per_client
    if num_shards > n:
        raise ValueError(
            f"partition.num_clients × shards_per_client must be ≤ the {n} training examples "
            f"(got {num_clients} × {per_client} = {num_shards})"
        )
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(n)
    order = shuffled[np.argsort(labels[shuffled], kind="stable")]
    bounds = np.arange(num_shards + 1, dtype=np.int64) * n // num_shards
    shard_of_position = np.repeat(np.arange(num_shards), np.diff(bounds))
    owner_of_shard = np.empty(num_shards, dtype=np.int64)
    owner_of_shard[rng.permutation(num_shards)] = np.arange(num_shards) // per_client
    return _group_by_client(owner_of_shard[shard_of_position], order, num_clients)


def _lognormal_sizes(n: int, num_clients: int, sigma: float, min_size: int, rng: np.random.Generator) -> np.ndarray:
    """Client sizes ``min_size + share of the rest ∝ lognormal(0, sigma)``, summing to ``n``.

    The rest is shared by the largest-remainder method, so the sum is exact.
    """
    weights = rng.lognormal(0.0, sigma, num_clients)
    spare = n - min_size * num_clients
    quota = weights / weights.sum() * spare
    extra = np.floor(quota).astype(np.int64)
    short = spare - int(extra.sum())
    if short > 0:
        extra[np.argsort(extra - quota, kind="stable")[:short]] += 1
    return min_size + extra


def lognormal(
    labels: np.ndarray,
    *,
    num_clients: int,
    sigma: float = 1.0,
    min_size: int = 1,
    seed: int,
    groups: np.ndarray | None = None,
) -> Partition:
    """Quantity skew: client sizes ∝ ``lognormal(0, sigma)`` draws, examples dealt uniformly.

    Each client first gets ``min_size`` examples; the remaining ``N - min_size * num_clients`` are
    shared in proportion to the lognormal weights (rounded so the sizes sum to ``N`` exactly).
    ``sigma = 0`` gives equal sizes. Labels are IID within every client.
    """
    n = _count(labels)
    num_clients = check_num_clients(num_clients, n)
    sigma = number("partition.sigma", sigma, at_least=0)
    min_size = integer("partition.min_size", min_size, 1)
    _check_min_size_fits(min_size, num_clients, n)
    rng = np.random.default_rng(seed)
    sizes = _lognormal_sizes(n, num_clients, sigma, min_size, rng)
    return _split_by_sizes(rng.permutation(n), sizes)


def natural(labels: np.ndarray, *, seed: int, groups: np.ndarray | None) -> Shares:
    """One client per distinct value of ``groups``; client ``i`` owns the ``i``-th smallest group.

    Deterministic; ``seed`` is accepted for the common call shape and unused. Indices within a
    client are ascending. Returned as :class:`~fedsim.data.shares.Shares` (a sequence of per-client arrays held as
    two arrays: a million devices need no million objects).
    """
    n = _count(labels)
    if groups is None:
        raise ValueError(_NATURAL_NEEDS_GROUPS)
    groups = np.asarray(groups)
    if groups.shape != (n,):
        raise ValueError(f"partition=natural: groups has shape {groups.shape}, labels has {n} entries")
    if n == 0:
        return Shares.of([])
    unique, client_of = np.unique(groups, return_inverse=True)
    return _group_shares(client_of.ravel(), np.arange(n), len(unique))


def auto(
    labels: np.ndarray, *, num_clients: int = 100, seed: int, groups: np.ndarray | None = None
) -> Sequence[np.ndarray]:
    """The data's natural clients when it has groups (e.g. Synthetic's devices), else :func:`iid` over ``num_clients``.

    The default of ``conf/``: ``data=synthetic`` keeps its devices, ``data=mnist`` gets 100 IID clients.
    """
    if groups is not None:
        return natural(labels, seed=seed, groups=groups)
    return iid(labels, num_clients=num_clients, seed=seed)


def follows_groups(partition: object) -> bool:
    """Whether ``partition`` (a partitioner, or a ``functools.partial`` of one, as Hydra's ``_partial_`` makes)
    is :func:`natural` or :func:`auto`: one client per natural group whenever the data has groups."""
    func = getattr(partition, "func", partition)
    return func in (natural, auto)
