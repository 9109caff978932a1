"""FLTrust: trust bootstrapped from a small clean dataset the server holds.

Cao, Fang, Liu, Gong. "FLTrust: Byzantine-robust Federated Learning via Trust Bootstrapping." NDSS 2021.

Every round the server trains the global model w on its root dataset itself (:mod:`fedsim.strategy.root_data`),
which gives the root update Δ₀. With Δᵢ = wᵢ − w client i's change::

    TSᵢ = ReLU(cos(Δᵢ, Δ₀))                     trust score: 0 for a change pointing away from Δ₀
    Δ̄ᵢ = Δᵢ · ‖Δ₀‖ / ‖Δᵢ‖                       every change rescaled to the root update's length
    w ← w + η · Σᵢ TSᵢ Δ̄ᵢ / Σⱼ TSⱼ

The paper's clients send model updates and the server steps with a global learning rate; here η is
``server_lr`` (1: the trusted changes' weighted mean, as FedAvg applies its mean). Unweighted by example counts,
as in the paper. Where the paper is silent: a change of length 0 gets trust 0 (its direction is undefined), and a
round in which no change is trusted (or the root update is 0) keeps the model. The root update counts only as
the yardstick; it is not averaged in. float64 arithmetic, folded in client-id order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from fedsim.core.checks import number
from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import Strategy
from fedsim.strategy.context import RunContext, root_size_setting
from fedsim.strategy.norm_bounding import in_client_order

if TYPE_CHECKING:
    from fedsim.strategy.root_data import RootTrainer


def trust_scores(deltas: Sequence[torch.Tensor], root: torch.Tensor) -> list[float]:
    """ReLU(cos(Δᵢ, Δ₀)) of each change against the root update ``root`` (0 where either has length 0)."""
    root_norm = float(root.norm())
    scores = []
    for delta in deltas:
        norm = float(delta.norm())
        cosine = float(torch.dot(delta, root)) / (norm * root_norm) if norm > 0 and root_norm > 0 else 0.0
        scores.append(max(cosine, 0.0))
    return scores


def fltrust_step(deltas: Sequence[torch.Tensor], root: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """Σᵢ TSᵢ·Δᵢ·‖Δ₀‖/‖Δᵢ‖ / Σᵢ TSᵢ (float64) and the scores TSᵢ; a zero step when no change is trusted."""
    scores = trust_scores(deltas, root)
    step = torch.zeros_like(root)
    total = sum(scores)
    if total == 0.0:
        return step, scores
    root_norm = float(root.norm())
    for delta, score in zip(deltas, scores, strict=True):
        if score > 0.0:
            step.add_(delta, alpha=score * root_norm / float(delta.norm()))
    return step.div_(total), scores


class FLTrust(Strategy):
    """w ← w + η·Σᵢ TSᵢ·Δ̄ᵢ / Σᵢ TSᵢ against a root update trained on ``root_size`` clean examples each round.

    Logs ``strategy/trusted_fraction`` (share of the round's changes with a trust score > 0),
    ``strategy/mean_trust`` (mean TSᵢ) and ``strategy/root_update_norm`` (‖Δ₀‖₂, every trusted change's length).
    After :meth:`aggregate`, ``selected_client_ids`` names the clients with a trust score > 0 (in an attacked run the
    server reports how many were malicious: ``attack/malicious_selected``), and each client's row holds its trust
    score (:meth:`client_metrics`).
    """

    def __init__(self, root_size: int = 100, server_lr: float = 1.0) -> None:
        self.root_size = root_size_setting(root_size)
        self.server_lr = number("strategy.server_lr", server_lr, above=0)
        self.root: RootTrainer | None = None
        self.selected_client_ids: list[int] | None = None
        self._metrics: dict[str, float] = {}
        self._trust: dict[int, float] = {}

    def setup(self, context: RunContext) -> None:
        self.root = context.root(self.root_size, "fltrust")

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        if self.root is None:
            raise RuntimeError("FLTrust.aggregate before setup(): the root dataset is drawn there")
        ordered = in_client_order(updates)
        start = global_params.to(torch.float64)
        root = self.root.train(round_num, global_params).to(torch.float64) - start
        deltas = [u.params.to(torch.float64) - start for u in ordered]
        step, scores = fltrust_step(deltas, root)
        self.selected_client_ids = [u.client_id for u, score in zip(ordered, scores, strict=True) if score > 0.0]
        self._trust = {u.client_id: score for u, score in zip(ordered, scores, strict=True)}
        self._metrics = {
            "trusted_fraction": sum(s > 0.0 for s in scores) / len(scores),
            "mean_trust": sum(scores) / len(scores),
            "root_update_norm": float(root.norm()),
        }
        return (start + self.server_lr * step).to(global_params.dtype)

    def round_metrics(self, round_num: int) -> dict[str, float]:
        return dict(self._metrics)

    def client_metrics(self, round_num: int) -> dict[int, dict[str, float]]:
        """Each aggregated client's trust score TSᵢ, as ``"trust"`` (in its row; TensorBoard
        ``client/strategy/trust``)."""
        return {client_id: {"trust": score} for client_id, score in self._trust.items()}
