"""Sparsifiers: top-k and random masks.

* :class:`TopK`: the ``fraction`` of coordinates largest in magnitude, with their int32 positions (Aji and Heafield,
  "Sparse Communication for Distributed Gradient Descent", EMNLP 2017; Lin et al., "Deep Gradient Compression",
  ICLR 2018). It is biased: pair it with error feedback (``compression.error_feedback=true``; Stich, Cordonnier and
  Jaggi, "Sparsified SGD with Memory", NeurIPS 2018), which :mod:`fedsim.comm.pipeline` keeps as client state.
* :class:`RandomMask`: a uniformly random subset of ``fraction`` of the coordinates, drawn from a seed the receiver
  also knows (only the 8-byte seed is sent), values scaled by n/k so the decoded vector is unbiased (Konečný et al.,
  "Federated Learning: Strategies for Improving Communication Efficiency", 2016, random-mask / subsampled updates).
"""

from __future__ import annotations

import math

import torch

from fedsim.comm.codecs import INDEX_BYTES, Selection, Sparsifier
from fedsim.core.checks import within

SEED_BYTES = 8


def _kept(fraction: float, n: int) -> int:
    """⌈fraction·n⌉, at least 1 and at most n; the product rounded to 9 decimals first, so that 0.4·10 (which is
    4.000000000000001 in binary floating point) keeps 4, not 5."""
    return min(n, max(1, math.ceil(round(fraction * n, 9)))) if n else 0


class TopK(Sparsifier):
    """The ⌈fraction·n⌉ coordinates of largest magnitude (at least one); ties broken towards lower positions."""

    def __init__(self, fraction: float = 0.01) -> None:
        within("topk.fraction", fraction, "(0, 1]")
        self.fraction = fraction

    def select(self, values: torch.Tensor, generator: torch.Generator) -> Selection:
        k = self.kept(values.numel())
        magnitude = values.abs()
        # the k-th largest magnitude, then everything above it and the lowest positions equal to it: the same
        # choice as a stable sort by magnitude (on every machine), without sorting all n values (10x faster)
        kth = torch.topk(magnitude, k, sorted=False).values.min()
        above = torch.nonzero(magnitude > kth).view(-1)
        ties = torch.nonzero(magnitude == kth).view(-1)[: k - above.numel()]
        return Selection(torch.sort(torch.cat([above, ties])).values, 1.0, self.side_bytes(values.numel()))

    def kept(self, n: int) -> int:
        return _kept(self.fraction, n)

    def side_bytes(self, n: int) -> int:
        return INDEX_BYTES * self.kept(n)

    def __repr__(self) -> str:
        return f"TopK(fraction={self.fraction})"


class RandomMask(Sparsifier):
    """⌈fraction·n⌉ coordinates drawn uniformly without replacement; values scaled by n/k (unbiased)."""

    def __init__(self, fraction: float = 0.1) -> None:
        within("random_mask.fraction", fraction, "(0, 1]")
        self.fraction = fraction

    def select(self, values: torch.Tensor, generator: torch.Generator) -> Selection:
        n = values.numel()
        k = self.kept(n)
        positions = torch.sort(torch.randperm(n, generator=generator)[:k]).values
        return Selection(positions, n / k if k else 1.0, SEED_BYTES)

    def kept(self, n: int) -> int:
        return _kept(self.fraction, n)

    def side_bytes(self, n: int) -> int:
        return SEED_BYTES

    def __repr__(self) -> str:
        return f"RandomMask(fraction={self.fraction})"
