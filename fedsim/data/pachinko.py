"""The Pachinko allocation partition of CIFAR-100 used by TFF's ``tff.simulation.datasets.cifar100``.

Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar & McMahan, "Adaptive Federated Optimization",
ICLR 2021 (its CIFAR-100 clients: 500 of 100 examples each), after the Pachinko Allocation Model of
Li & McCallum, "Pachinko Allocation: DAG-Structured Mixture Models of Topic Correlations", ICML 2006.

Every client ``i`` draws, once, a multinomial over the coarse classes ``θ_i ~ Dir(alpha)`` and, for
every coarse class ``c``, a multinomial over that coarse class's fine labels ``φ_ic ~ Dir(beta)``.
Clients are then filled one after another; each of a client's examples is drawn by picking a coarse
class from ``θ_i``, a fine label from ``φ_ic``, and an example of that fine label uniformly at random
without replacement. When the last example of a fine label is taken, that label is removed from every
later fine multinomial (which is renormalised); when all fine labels of a coarse class are gone, the
coarse class is removed from the coarse multinomials in the same way. The exhaustion state is shared
by all clients, so later clients see fewer labels (as in TFF's files).

Implementation: between two exhaustions a client's draws are i.i.d. from fixed distributions, so they
are drawn in one vectorised batch, cut just after the draw that empties a label, and redrawn from the
renormalised distributions for the rest. That is exactly the one-at-a-time process, in at most
``num_clients + (number of labels)`` batches (about 0.2 s for 50,000 CIFAR-100 labels on 2 cores).

Decisions the sources leave open:

* Client sizes. With ``N`` examples and ``R = N - num_clients * examples_per_client`` left over, a
  first pass gives every client ``examples_per_client`` (the default ``N // num_clients``; TFF's
  50,000 = 500 × 100 leaves none), then a second pass over the clients in the same order draws the
  ``R`` leftovers from the same per-client distributions: client ``i`` gets ``R // num_clients`` more,
  plus one if ``i < R % num_clients``. So every example is assigned exactly once (as every fedsim
  partitioner does), and with the default sizes differ by at most one.
* Underflow. ``Dir(0.1)`` often gives probabilities that are exactly 0 in float64; if all of a
  client's remaining coarse (or fine) mass is 0, that draw is uniform over the remaining labels.
* ``coarse_of`` maps every fine label to its coarse class (default :data:`CIFAR100_COARSE_OF`).
  Fine labels without examples start out exhausted; ``Dir(alpha)`` is still over all coarse classes
  of the map, and ``Dir(beta)`` over all fine labels of a coarse class.
"""

from __future__ import annotations

from typing import cast

import numpy as np

from fedsim.core.checks import integer, number
from fedsim.data.partition import Partition, as_labels, check_num_clients

CIFAR100_COARSE_OF = np.array(
    [
        4,
        1,
        14,
        8,
        0,
        6,
        7,
        7,
        18,
        3,
        3,
        14,
        9,
        18,
        7,
        11,
        3,
        9,
        7,
        11,
        6,
        11,
        5,
        10,
        7,
        6,
        13,
        15,
        3,
        15,
        0,
        11,
        1,
        10,
        12,
        14,
        16,
        9,
        11,
        5,
        5,
        19,
        8,
        8,
        15,
        13,
        14,
        17,
        18,
        10,
        16,
        4,
        17,
        4,
        2,
        0,
        17,
        4,
        18,
        17,
        10,
        3,
        2,
        12,
        12,
        16,
        12,
        1,
        9,
        19,
        2,
        10,
        0,
        1,
        16,
        12,
        9,
        13,
        15,
        13,
        16,
        19,
        2,
        4,
        6,
        19,
        5,
        5,
        8,
        19,
        18,
        1,
        2,
        15,
        6,
        0,
        17,
        8,
        14,
        13,
    ],
    dtype=np.int64,
)
"""CIFAR-100's superclass (coarse label, 0..19) of every fine label 0..99, both in the alphabetical order
of the dataset's ``meta`` file (e.g. fine 0 ``apple`` → coarse 4 ``fruit_and_vegetables``); five fine
labels per superclass, as listed on https://www.cs.toronto.edu/~kriz/cifar.html."""


class _Labels:
    """The label tree and what is left of it: ``table[c, j]`` is coarse class ``c``'s ``j``-th fine label
    (-1 pads shorter rows); ``pool[start[f]:start[f] + total[f]]`` holds fine label ``f``'s examples in
    random order, ``taken[f]`` of them already given out."""

    def __init__(self, labels: np.ndarray, coarse_of: np.ndarray, rng: np.random.Generator) -> None:
        coarses, coarse_idx = np.unique(coarse_of, return_inverse=True)
        fine_sorted = np.argsort(coarse_idx, kind="stable")
        widths = np.bincount(coarse_idx, minlength=len(coarses))
        self.table = np.full((len(coarses), int(widths.max())), -1, dtype=np.int64)
        for c, row in enumerate(np.split(fine_sorted, np.cumsum(widths)[:-1])):
            self.table[c, : len(row)] = row
        self.widths = widths
        shuffled = rng.permutation(len(labels))
        self.pool = shuffled[np.argsort(labels[shuffled], kind="stable")].astype(np.int64)
        self.total = np.bincount(labels, minlength=len(coarse_of))
        self.start = np.concatenate([[0], np.cumsum(self.total)[:-1]])
        self.taken = np.zeros(len(coarse_of), dtype=np.int64)

    def alive(self) -> np.ndarray:
        """``(K, F)`` bool: which table entries still have examples."""
        left = self.total - self.taken
        return (self.table >= 0) & (left[np.maximum(self.table, 0)] > 0)

    def take(self, fine: np.ndarray) -> np.ndarray:
        """Give out one example per entry of ``fine`` (the example indices), stopping just after the draw that
        empties a label: the draws after it came from distributions that are no longer the client's."""
        rank = _occurrence(fine)  # 1 for a label's first draw in the batch, 2 for its second, ...
        emptied = np.flatnonzero(rank == (self.total - self.taken)[fine])
        if emptied.size:
            fine, rank = fine[: emptied[0] + 1], rank[: emptied[0] + 1]
        out = self.pool[self.start[fine] + self.taken[fine] + rank - 1]
        self.taken += np.bincount(fine, minlength=len(self.taken))
        return out


def _occurrence(values: np.ndarray) -> np.ndarray:
    """For every position, how many times its value has occurred up to and including it."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    pos = np.arange(len(values))
    first = np.maximum.accumulate(np.where(np.r_[True, ordered[1:] != ordered[:-1]], pos, 0))
    rank = np.empty_like(pos)
    rank[order] = pos - first + 1
    return rank


def _pick(weights: np.ndarray, alive: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Per row of ``weights`` (masked by ``alive``, renormalised; uniform over ``alive`` where that mass is
    0), the entry that the uniform numbers ``u`` select by inverse CDF. Never picks a dead entry."""
    w = np.where(alive & np.isfinite(weights), weights, 0.0)
    dead_mass = w.sum(axis=1) <= 0
    w[dead_mass] = alive[dead_mass]
    cdf = np.cumsum(w, axis=1)
    idx = (cdf <= (u * cdf[:, -1])[:, None]).sum(axis=1)
    last_alive = alive.shape[1] - 1 - np.argmax(alive[:, ::-1], axis=1)
    return np.minimum(idx, last_alive)


def _draw(tree: _Labels, theta: np.ndarray, phi: np.ndarray, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``count`` examples for one client with coarse weights ``theta`` (K,) and fine weights ``phi`` (K, F)."""
    parts = []
    while count > 0:
        alive = tree.alive()
        coarse = _pick(theta[None, :], cast(np.ndarray, alive.any(axis=1))[None, :], rng.random(count))
        slot = _pick(phi[coarse], alive[coarse], rng.random(count))
        got = tree.take(tree.table[coarse, slot])
        parts.append(got)
        count -= len(got)
    return parts


def _fine_weights(widths: np.ndarray, beta: float, num_clients: int, rng: np.random.Generator) -> np.ndarray:
    """``(num_clients, K, F)``: per client and coarse class, ``Dir(beta)`` over its fine labels (0 padding)."""
    phi = np.zeros((num_clients, len(widths), int(widths.max())))
    for width in np.unique(widths):
        rows = np.flatnonzero(widths == width)
        phi[:, rows, :width] = rng.dirichlet(np.full(width, beta), size=(num_clients, len(rows)))
    return phi


def _check_coarse_of(coarse_of: object, labels: np.ndarray) -> np.ndarray:
    """``coarse_of`` as a 1-D int64 array covering every label; one-line errors otherwise."""
    arr = CIFAR100_COARSE_OF if coarse_of is None else np.asarray(coarse_of)
    if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu" or arr.min() < 0:
        raise ValueError("partition.coarse_of must be a non-empty 1-D list of coarse class ids ≥ 0, one per fine label")
    if labels.size and labels.max() >= arr.size:
        raise ValueError(
            f"partition.coarse_of must map every label (label {int(labels.max())} is beyond its {arr.size} entries)"
        )
    return arr.astype(np.int64)


def _sizes(n: int, num_clients: int, examples_per_client: object) -> tuple[int, np.ndarray]:
    """The first pass's size per client and the second pass's (leftover) sizes; see the module docstring."""
    if examples_per_client is None:
        per_client = n // num_clients
    else:
        per_client = integer("partition.examples_per_client", examples_per_client, 1)
    if per_client * num_clients > n:
        raise ValueError(
            f"partition.examples_per_client × num_clients must be ≤ the {n} training examples "
            f"(got {per_client} × {num_clients} = {per_client * num_clients})"
        )
    rest = n - per_client * num_clients
    return per_client, rest // num_clients + (np.arange(num_clients) < rest % num_clients)


def pachinko(
    labels: np.ndarray,
    *,
    num_clients: int = 500,
    alpha: float = 0.1,
    beta: float = 10.0,
    examples_per_client: int | None = None,
    seed: int,
    groups: np.ndarray | None = None,
    coarse_of: np.ndarray | list[int] | None = None,
) -> Partition:
    """Split by Pachinko allocation (module docstring): coarse ``Dir(alpha)``, fine ``Dir(beta)`` per client.

    The defaults are TFF's CIFAR-100 clients (500 clients, alpha 0.1, beta 10, 100 examples each on the
    50,000 training images). ``labels`` are fine labels ``0..len(coarse_of)-1``. Client ``i``'s indices come
    in the order drawn. ``groups`` is ignored. Deterministic in ``seed``.
    """
    labels = as_labels(labels)
    if labels.dtype.kind not in "iu" or (labels.size and labels.min() < 0):
        raise ValueError("partition=pachinko needs integer class labels ≥ 0 (the fine labels)")
    n = len(labels)
    num_clients = check_num_clients(num_clients, n)
    alpha, beta = number("partition.alpha", alpha, above=0), number("partition.beta", beta, above=0)
    coarse_of = _check_coarse_of(coarse_of, labels)
    per_client, extra = _sizes(n, num_clients, examples_per_client)
    rng = np.random.default_rng(seed)
    tree = _Labels(labels.astype(np.int64), coarse_of, rng)
    theta = rng.dirichlet(np.full(len(tree.widths), alpha), size=num_clients)
    phi = _fine_weights(tree.widths, beta, num_clients, rng)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for counts in (np.full(num_clients, per_client), extra):
        for i in np.flatnonzero(counts):
            parts[i] += _draw(tree, theta[i], phi[i], int(counts[i]), rng)
    return [np.concatenate(p).astype(np.int64, copy=False) if p else np.zeros(0, np.int64) for p in parts]
