"""Each client's local train/test split (for federated evaluation on the clients' own held-out data)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedsim.core.checks import within
from fedsim.data.shares import Shares


def _test_counts(sizes: np.ndarray, test_fraction: float) -> np.ndarray:
    """``round(test_fraction * n)`` per client, capped so a non-empty client keeps one train example."""
    wanted = np.rint(test_fraction * sizes).astype(np.int64)  # round half to even, like round()
    return np.minimum(wanted, np.maximum(sizes - 1, 0))


def _by_client_then_key(client_of: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``np.lexsort((keys, client_of))`` for keys in [0, 1), 10-20× faster for millions of rows.

    Each row gets one 64-bit integer: its client in the high 32 bits, the top 32 of its key's 53 bits below. A
    stable sort of those (already grouped by client: timsort merges runs) is the lexsort's order wherever the
    integers differ; where two rows of a client share them (about one run in a hundred at 10^7 rows), the lexsort
    itself decides.
    """
    if not len(client_of) or client_of.max() >= 1 << 32:
        return np.lexsort((keys, client_of))
    fraction = (keys * 2.0**53).astype(np.uint64) >> np.uint64(21)
    combined = (client_of.astype(np.uint64) << np.uint64(32)) | fraction
    order = np.argsort(combined, kind="stable")
    ordered = combined[order]
    if np.any(ordered[1:] == ordered[:-1]):
        return np.lexsort((keys, client_of))
    return order


def split_train_test(indices: Sequence[np.ndarray], test_fraction: float, *, seed: int) -> tuple[Shares, Shares]:
    """Split each client's indices at random into ``(train parts, test parts)``.

    Client ``i``'s test part has ``round(test_fraction * n_i)`` examples, except that every
    non-empty client keeps at least one training example. The two parts of a client are disjoint
    and together are exactly its indices. Vectorised over all clients (one random key per example,
    one sort), so it is fast for very many clients; ``indices`` may be a list of arrays or
    :class:`~fedsim.data.shares.Shares`, and both parts come back as :class:`~fedsim.data.shares.Shares`.
    """
    within("client_test_fraction", test_fraction, "[0, 1)")
    shares = Shares.of(indices)
    if not len(shares):
        return shares, shares
    sizes, flat, client_of = shares.sizes, shares.flat, shares.owners()
    keys = np.random.default_rng(seed).random(len(flat))
    order = _by_client_then_key(client_of, keys)  # a shuffle within clients
    rank = np.arange(len(flat)) - shares.offsets[:-1][client_of]  # client_of[order] == client_of
    test_counts = _test_counts(sizes, float(test_fraction))
    is_test = rank < test_counts[client_of]
    shuffled = flat[order]  # grouped by client, each client's test part first: masks keep that grouping
    return Shares.from_sizes(shuffled[~is_test], sizes - test_counts), Shares.from_sizes(shuffled[is_test], test_counts)
