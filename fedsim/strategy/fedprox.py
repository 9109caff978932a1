"""FedProx: FedAvg aggregation plus a proximal term μ/2 ‖w − w_global‖² in every client's objective,
keeping stragglers' partial work.

Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith. "Federated Optimization in Heterogeneous Networks."
MLSys 2020. Both halves live here: :class:`FedProx` (server) and :class:`ProximalTerm` (client).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fedsim.core.checks import number
from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import LocalTraining, Strategy, gradients
from fedsim.strategy.functional import weighted_average


class ProximalTerm(LocalTraining):
    """Client half: remembers the global weights at the start of a task and minimises μ/2 ‖w − w_global‖²
    too, by adding its gradient μ (w − w_global) to every step's gradients (so the reported training
    loss is the data loss alone)."""

    def __init__(self) -> None:
        self.mu = 0.0
        self.anchor: list[torch.Tensor] = []

    def begin(self, model: nn.Module, config: dict[str, Any]) -> None:
        self.mu = float(config.get("prox_mu", 0.0))
        self.anchor = [p.detach().clone() for p in model.parameters() if p.requires_grad]

    def before_step(self, model: nn.Module) -> None:
        if self.mu == 0.0:
            return
        params, grads = gradients(model)
        with torch.no_grad():
            torch._foreach_add_(grads, torch._foreach_sub(params, self.anchor), alpha=self.mu)

    def functional_term(
        self, params: dict[str, torch.Tensor], anchor: dict[str, torch.Tensor], numbers: dict[str, torch.Tensor]
    ) -> torch.Tensor | None:
        """The same term for ``executor=vmap``: μ comes from the task's config, per client."""
        if "prox_mu" not in numbers:
            return None
        squared = sum(((p - anchor[name]) ** 2).sum() for name, p in params.items())
        return 0.5 * numbers["prox_mu"] * squared


class FedProx(Strategy):
    """Server half: example-weighted mean of all updates, stragglers included; sends μ to clients."""

    keeps_stragglers = True
    needs = frozenset()  # a function of the mean update alone (runs under central DP and secure aggregation)

    def __init__(self, *, mu: float = 0.01) -> None:
        number("strategy.mu", mu, at_least=0)
        self.mu = mu

    def local_training(self) -> LocalTraining:
        return ProximalTerm()

    def client_config(self, round_num: int, client_id: int) -> dict[str, Any]:
        return {"prox_mu": self.mu}

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        return weighted_average([u.params for u in updates], [u.num_examples for u in updates])
