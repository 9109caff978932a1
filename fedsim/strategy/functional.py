"""Pure aggregation math on flat parameter vectors. No state, no I/O; every strategy builds on these."""

from __future__ import annotations

from collections.abc import Sequence

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
    for vector, weight in zip(vectors, weights):
        acc.add_(vector.to(torch.float64), alpha=float(weight) / total)
    return acc.to(vectors[0].dtype)
