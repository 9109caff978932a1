"""Centred clipping: clip every client's change around a centre that starts at the previous round's aggregate.

Karimireddy, He, Jaggi. "Learning from History for Byzantine Robust Optimization." ICML 2021.

With w the global weights, Δᵢ = wᵢ − w the changes of the round's n clients and v the centre (the previous
round's aggregated change; 0 in the first round), L times::

    v ← v + (1/n) Σᵢ clip_τ(Δᵢ − v),    clip_τ(z) = z · min(1, τ / ‖z‖₂)

then w ← w + v, and v is kept for the next round (in :meth:`state_dict`, so a resumed run is exact). Unweighted,
as in the paper. τ is the same at every iteration (the paper's analysis allows a τ per iteration; the authors'
code uses one). The paper's clients send worker momentum; fedsim's send their change after local training, so v
plays the part of the previous aggregate over rounds. float64 arithmetic, folded in client-id order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fedsim.core.checks import integer, number
from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import Strategy
from fedsim.strategy.norm_bounding import clip_factor, in_client_order


class CenteredClipping(Strategy):
    """L = ``iterations`` steps of v ← v + mean(clip_τ(Δᵢ − v)) from the previous round's v; w ← w + v.

    Logs ``strategy/clipped_fraction`` (share of the updates clipped in the last iteration) and
    ``strategy/center_norm`` (‖v‖₂, the model's change this round).
    """

    def __init__(self, tau: float = 1.0, iterations: int = 1) -> None:
        self.tau = number("strategy.tau", tau, above=0)
        self.iterations = integer("strategy.iterations", iterations, 1)
        self.center: torch.Tensor | None = None  # float64; None until the first aggregate (v = 0)
        self._metrics: dict[str, float] = {}

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        ordered = in_client_order(updates)
        start = global_params.to(torch.float64)
        if self.center is not None and self.center.shape != start.shape:
            raise ValueError(f"the centre has shape {tuple(self.center.shape)}, the model {tuple(start.shape)}")
        v = torch.zeros_like(start) if self.center is None else self.center.clone()
        for _ in range(self.iterations):
            step, clipped = torch.zeros_like(start), 0
            for update in ordered:
                z = update.params.to(torch.float64) - start - v  # Δᵢ − v
                factor = clip_factor(float(z.norm()), self.tau)
                clipped += factor < 1.0
                step.add_(z, alpha=factor)
            v.add_(step.div_(len(ordered)))
        self.center = v
        self._metrics = {"clipped_fraction": clipped / len(ordered), "center_norm": float(v.norm())}
        return (start + v).to(global_params.dtype)

    def round_metrics(self, round_num: int) -> dict[str, float]:
        return dict(self._metrics)

    def state_dict(self) -> dict[str, Any]:
        """``{"center": float64 tensor | None}`` (a copy; None before the first round)."""
        return {"center": None if self.center is None else self.center.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        center = state["center"]
        self.center = None if center is None else center.detach().to(torch.float64, copy=True)
