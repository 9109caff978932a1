"""Norm bounding: each client's change is scaled to an L2 norm of at most M, then the changes are averaged.

Sun, Kairouz, Suresh, McMahan. "Can You Really Backdoor Federated Learning?" arXiv:1911.07963, 2019
(the "norm thresholding of updates" defence against boosted, model-replacement updates).

With w the global weights, wᵢ client i's trained weights and nᵢ its example count::

    Δᵢ = wᵢ − w,    Δ̃ᵢ = Δᵢ · min(1, M / ‖Δᵢ‖₂),    w ← w + Σᵢ pᵢ Δ̃ᵢ

pᵢ = nᵢ / Σⱼ nⱼ (``weighted=True``, FedAvg's weights: with no change clipped this is FedAvg) or 1/n
(``weighted=False``: a client that overstates its data set gains nothing). A client, however far it moves,
then moves the model by at most pᵢ·M. The arithmetic is float64, folded in client-id order.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import torch

from fedsim.core.checks import number
from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import Strategy


def clip_factor(norm: float, bound: float) -> float:
    """min(1, bound / norm): what brings a vector of L2 norm ``norm`` within ``bound`` (1 when it already is)."""
    return 1.0 if norm <= bound else bound / norm


def in_client_order(updates: Sequence[ClientUpdate]) -> list[ClientUpdate]:
    """``updates`` sorted by client id (the summation order), refusing an empty round."""
    if len(updates) == 0:
        raise ValueError("needs at least one update")
    return sorted(updates, key=lambda u: u.client_id)


class NormBounding(Strategy):
    """w ← w + Σᵢ pᵢ·Δᵢ·min(1, M/‖Δᵢ‖₂), M = ``max_norm``; pᵢ ∝ nᵢ (``weighted``) or uniform.

    Logs ``strategy/clipped_fraction`` (share of the round's updates that were scaled down) and
    ``strategy/delta_norm_median`` / ``strategy/delta_norm_max`` (‖Δᵢ‖₂ before clipping: what to pick M from), and
    each client's ``delta_norm`` and ``clip_factor`` in its row (:meth:`client_metrics`).
    """

    def __init__(self, max_norm: float = 1.0, weighted: bool = True) -> None:
        self.max_norm = number("strategy.max_norm", max_norm, above=0)
        if not isinstance(weighted, bool):
            raise ValueError(f"strategy.weighted must be true or false (got {weighted!r})")
        self.weighted = weighted
        self._metrics: dict[str, float] = {}
        self._per_client: dict[int, dict[str, float]] = {}

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        ordered = in_client_order(updates)
        weights = [float(u.num_examples) if self.weighted else 1.0 for u in ordered]
        total = math.fsum(weights)
        if not total > 0:
            raise ValueError(f"the round's updates hold no examples (total num_examples is {total})")
        start = global_params.to(torch.float64)
        step = torch.zeros_like(start)
        norms = []
        self._per_client = {}
        for update, weight in zip(ordered, weights, strict=True):
            delta = update.params.to(torch.float64) - start
            norm = float(delta.norm())
            norms.append(norm)
            factor = clip_factor(norm, self.max_norm)
            self._per_client[update.client_id] = {"delta_norm": norm, "clip_factor": factor}
            step.add_(delta, alpha=weight / total * factor)
        self._metrics = {
            "clipped_fraction": sum(n > self.max_norm for n in norms) / len(norms),
            "delta_norm_median": statistics.median(norms),
            "delta_norm_max": max(norms),
        }
        return (start + step).to(global_params.dtype)

    def round_metrics(self, round_num: int) -> dict[str, float]:
        return dict(self._metrics)

    def client_metrics(self, round_num: int) -> dict[int, dict[str, float]]:
        """Each aggregated client's ``delta_norm`` (‖Δᵢ‖₂) and ``clip_factor`` (min(1, M/‖Δᵢ‖₂), 1: not clipped)."""
        return {client_id: dict(values) for client_id, values in self._per_client.items()}
