"""Pure aggregation math on flat parameter vectors. No state, no I/O; every strategy builds on these.

Robust aggregation: coordinate-wise median and trimmed mean from Yin, Chen, Ramchandran, Bartlett,
"Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates", ICML 2018; Krum and
Multi-Krum from Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with Adversaries:
Byzantine Tolerant Gradient Descent", NeurIPS 2017.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch


def weighted_average(vectors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """Σ wᵢ·vᵢ / Σ wᵢ, folded in the given order with a float64 accumulator (deterministic).

    Raises ``ValueError`` when there is nothing to average or the total weight is not positive.
    """
    if len(vectors) == 0:
        raise ValueError("weighted_average needs at least one vector")
    if len(vectors) != len(weights):
        raise ValueError(f"got {len(vectors)} vectors but {len(weights)} weights")
    total = float(sum(weights))
    if not total > 0:
        raise ValueError(f"total weight must be positive (got {total})")
    acc = torch.zeros_like(vectors[0], dtype=torch.float64)
    for vector, weight in zip(vectors, weights, strict=True):
        acc.add_(vector.to(torch.float64), alpha=float(weight) / total)
    return acc.to(vectors[0].dtype)


# --- robust aggregation (each takes a stack of shape (n clients, ...) and ignores example counts) -------------

_COLUMNS_PER_CHUNK = 1 << 20  # sort this many coordinates at a time: bounds the memory of sort's index tensor


def _sorted_reduce(stack: torch.Tensor, reduce: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Sort every coordinate's n values (dim 0) and apply ``reduce`` to each chunk of sorted columns.

    Sorting makes the result independent of the order of the clients, bit for bit.
    """
    if stack.dim() < 1 or stack.shape[0] == 0:
        raise ValueError("robust aggregation needs at least one vector")
    flat = stack.reshape(stack.shape[0], -1)
    out = torch.empty(flat.shape[1], dtype=stack.dtype)
    for start in range(0, flat.shape[1], _COLUMNS_PER_CHUNK):
        columns = slice(start, start + _COLUMNS_PER_CHUNK)
        out[columns] = reduce(flat[:, columns].sort(dim=0).values).to(stack.dtype)
    return out.reshape(stack.shape[1:])


def coordinate_median(stack: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median of ``stack`` along dim 0 (Yin et al., ICML 2018).

    For an even number of vectors it is the mean of the two middle values (computed in float64), not
    ``torch.median``'s lower middle value, so it is symmetric and order-independent.
    """
    n = stack.shape[0] if stack.dim() > 0 else 0

    def middle(ordered: torch.Tensor) -> torch.Tensor:
        if n % 2 == 1:
            return ordered[n // 2]
        return (ordered[n // 2 - 1].to(torch.float64) + ordered[n // 2].to(torch.float64)) / 2

    return _sorted_reduce(stack, middle)


def trim_count(n: int, beta: float) -> int:
    """⌊β·n⌋, the number of values trimmed from each end (rounded to 9 decimals first, so 0.3·10 is 3)."""
    return math.floor(round(beta * n, 9))


def trimmed_mean(stack: torch.Tensor, beta: float) -> torch.Tensor:
    """Coordinate-wise β-trimmed mean along dim 0 (Yin et al., ICML 2018).

    Per coordinate, drops the ⌊β·n⌋ largest and the ⌊β·n⌋ smallest values and averages the rest
    (float64 accumulator). ``beta`` must be in [0, 0.5); ``beta=0`` is the plain unweighted mean.
    """
    if not 0 <= beta < 0.5:
        raise ValueError(f"trimmed_mean needs 0 <= beta < 0.5 (got {beta!r})")
    n = stack.shape[0] if stack.dim() > 0 else 0
    k = trim_count(n, beta)
    if n - 2 * k < 1:
        raise ValueError(f"trimmed_mean with beta={beta} keeps no value of {n}")
    return _sorted_reduce(stack, lambda ordered: ordered[k : n - k].sum(dim=0, dtype=torch.float64) / (n - 2 * k))


def pairwise_squared_distances(stack: torch.Tensor) -> torch.Tensor:
    """(n, n) float64 matrix of ‖xᵢ − xⱼ‖², computed pair by pair (exact-order, symmetric, no n×d copy)."""
    flat = stack.reshape(stack.shape[0], -1)
    n = flat.shape[0]
    distances = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        row = flat[i].to(torch.float64)
        for j in range(i + 1, n):
            distances[i, j] = distances[j, i] = (row - flat[j].to(torch.float64)).square().sum()
    return distances


def krum_scores(stack: torch.Tensor, f: int) -> torch.Tensor:
    """Krum score of every vector: the sum of its squared distances to its n − f − 2 nearest others
    (Blanchard et al., NeurIPS 2017). Needs n − f − 2 ≥ 1."""
    n = stack.shape[0]
    neighbours = n - f - 2
    if f < 0 or neighbours < 1:
        raise ValueError(f"krum needs f >= 0 and n - f - 2 >= 1 (got n={n}, f={f})")
    distances = pairwise_squared_distances(stack)
    others = [torch.cat([distances[i, :i], distances[i, i + 1 :]]) for i in range(n)]
    return torch.stack([row.sort().values[:neighbours].sum() for row in others])


def krum_select(stack: torch.Tensor, f: int, m: int = 1) -> list[int]:
    """Indices (into dim 0 of ``stack``) of the ``m`` best-scored vectors, best first (Multi-Krum; Krum is m=1).

    Ties in score go to the lower index, so give the vectors in a canonical order (fedsim: client id).
    """
    n = stack.shape[0]
    if not 1 <= m <= n:
        raise ValueError(f"krum_select needs 1 <= m <= n (got m={m}, n={n})")
    order = torch.sort(krum_scores(stack, f), stable=True).indices
    return [int(i) for i in order[:m]]
