"""Each client's local train/test split (for federated evaluation on the clients' own held-out data)."""

from __future__ import annotations

from numbers import Real

import numpy as np

from fedsim.data.partition import _group_by_client


def _test_counts(sizes: np.ndarray, test_fraction: float) -> np.ndarray:
    """``round(test_fraction * n)`` per client, capped so a non-empty client keeps one train example."""
    wanted = np.rint(test_fraction * sizes).astype(np.int64)  # round half to even, like round()
    return np.minimum(wanted, np.maximum(sizes - 1, 0))


def split_train_test(
    indices: list[np.ndarray], test_fraction: float, *, seed: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split each client's indices at random into ``(train parts, test parts)``.

    Client ``i``'s test part has ``round(test_fraction * n_i)`` examples, except that every
    non-empty client keeps at least one training example. The two parts of a client are disjoint
    and together are exactly its indices. Vectorised over all clients (one random key per example,
    one sort), so it is fast for very many clients.
    """
    ok = isinstance(test_fraction, Real) and not isinstance(test_fraction, bool)
    if not ok or not 0 <= test_fraction < 1:
        raise ValueError(f"client_test_fraction must be in [0, 1) (got {test_fraction!r})")
    if not indices:
        return [], []
    sizes = np.fromiter((len(part) for part in indices), dtype=np.int64, count=len(indices))
    flat = np.concatenate([np.asarray(part, dtype=np.int64).ravel() for part in indices])
    client_of = np.repeat(np.arange(len(indices)), sizes)
    keys = np.random.default_rng(seed).random(len(flat))
    order = np.lexsort((keys, client_of))  # by client, then random key: a shuffle within clients
    starts = np.cumsum(sizes) - sizes
    rank = np.arange(len(flat)) - starts[client_of]  # client_of[order] == client_of
    is_test = rank < _test_counts(sizes, float(test_fraction))[client_of]
    shuffled = flat[order]
    test = _group_by_client(client_of[is_test], shuffled[is_test], len(indices))
    train = _group_by_client(client_of[~is_test], shuffled[~is_test], len(indices))
    return train, test
