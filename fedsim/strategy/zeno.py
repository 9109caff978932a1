"""Zeno: rank the updates by how much they lower the loss on data the server holds, keep the best, average them.

Xie, Koyejo, Gupta. "Zeno: Distributed Stochastic Gradient Descent with Suspicion-based Fault-tolerance." ICML 2019.

With w the global weights and Δᵢ = wᵢ − w client i's change, Zeno's stochastic descendant score is::

    scoreᵢ = f_r(w) − f_r(w + Δᵢ) − ρ·‖Δᵢ‖²

where f_r is the loss on the server's data (fedsim's root dataset, :mod:`fedsim.strategy.root_data`). The n − b
updates with the highest scores are kept and their changes averaged, unweighted as in the paper:
w ← w + mean(kept Δᵢ).

The paper's workers send gradients u and the score uses w − γ·u; a client's change Δᵢ plays the part of −γ·u here,
so ρ is in units of the change. The paper scores each iteration on a fresh mini-batch of its validation data; fedsim
scores every round on the whole root dataset (``root_size`` examples, drawn once from the seed), so the scores are a
pure function of the round's updates. b should be at least the number of attackers per round. Equal scores go to the
lower client id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from fedsim.core.checks import integer, number
from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import Strategy
from fedsim.strategy.context import RunContext, root_size_setting
from fedsim.strategy.norm_bounding import in_client_order

if TYPE_CHECKING:
    from fedsim.strategy.root_data import RootTrainer


def zeno_keep(scores: Sequence[float], b: int) -> list[int]:
    """Indices of the ``len(scores) - b`` highest scores, in index order (equal scores: the lower index first)."""
    ranked = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return sorted(ranked[: len(scores) - b])


class Zeno(Strategy):
    """w ← w + the unweighted mean change of the n − ``b`` updates with the best Zeno scores on the root dataset.

    Logs ``strategy/score_kept_min`` and ``strategy/score_dropped_max`` (the two sides of the cut) and
    ``strategy/root_loss`` (f_r(w)); each client's row holds its ``score`` and ``selected`` (1 or 0), and
    ``selected_client_ids`` names the kept updates (``attack/malicious_selected`` in an attacked run).
    """

    def __init__(self, b: int = 1, rho: float = 0.0005, root_size: int = 100) -> None:
        self.b, self.rho = integer("strategy.b", b, 0), number("strategy.rho", rho, at_least=0)
        self.root_size = root_size_setting(root_size)
        self.root: RootTrainer | None = None
        self.selected_client_ids: list[int] | None = None
        self._scores: dict[int, float] = {}
        self._metrics: dict[str, float] = {}

    def setup(self, context: RunContext) -> None:
        self.root = context.root(self.root_size, "zeno")

    def check(self, clients_per_round: int) -> None:
        if self.b >= clients_per_round:
            raise ValueError(
                f"strategy=zeno keeps n - b updates: strategy.b={self.b} must be below "
                f"clients_per_round={clients_per_round}"
            )

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        if self.root is None:
            raise RuntimeError("Zeno.aggregate before setup(): the root dataset is drawn there")
        ordered = in_client_order(updates)
        if self.b >= len(ordered):
            raise ValueError(f"strategy.b={self.b} leaves none of the round's {len(ordered)} updates")
        start = global_params.to(torch.float64)
        base = self.root.loss(global_params)
        deltas = [u.params.to(torch.float64) - start for u in ordered]
        scores = [
            base - self.root.loss(u.params) - self.rho * float(d.dot(d)) for u, d in zip(ordered, deltas, strict=True)
        ]
        kept = zeno_keep(scores, self.b)
        step = torch.zeros_like(start)
        for i in kept:
            step.add_(deltas[i])
        self.selected_client_ids = [ordered[i].client_id for i in kept]
        self._scores = {u.client_id: score for u, score in zip(ordered, scores, strict=True)}
        dropped = [scores[i] for i in range(len(scores)) if i not in kept]
        self._metrics = {
            "root_loss": base,
            "score_kept_min": min(scores[i] for i in kept),
            "score_dropped_max": max(dropped) if dropped else float("nan"),
        }
        return (start + step / len(kept)).to(global_params.dtype)

    def round_metrics(self, round_num: int) -> dict[str, float]:
        return dict(self._metrics)

    def client_metrics(self, round_num: int) -> dict[int, dict[str, float]]:
        """Each aggregated client's Zeno ``score`` and ``selected`` (1 if kept)."""
        kept = set(self.selected_client_ids or ())
        return {cid: {"score": score, "selected": float(cid in kept)} for cid, score in self._scores.items()}
