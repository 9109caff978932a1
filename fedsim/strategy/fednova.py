"""FedNova: normalised averaging, so that clients doing more local steps do not pull the model their way.

Wang, Liu, Liang, Joshi, Poor. "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization." NeurIPS 2020. With plain local SGD, client k takes τ_k steps from the global weights w to w_k;
its cumulative update w − w_k = η_k Σ_t g_k(t) is normalised by its number of steps, a_k = (1, …, 1) and
‖a_k‖₁ = τ_k:

    d_k = (w − w_k) / τ_k                      (normalised update; carries the client's own η_k)
    p_k = n_k / Σ_j n_j,    τ_eff = Σ_k p_k τ_k
    w  ← w − η_g · τ_eff · Σ_k p_k d_k         (η_g: ``server_lr``)

So client k's update (w_k − w) is weighted p_k τ_eff / τ_k instead of FedAvg's p_k: a client with more steps
than τ_eff counts for less, a straggler with fewer for more. With equal τ_k (and η_g = 1) τ_eff / τ_k = 1
and this is exactly FedAvg's Σ_k p_k w_k (up to float32 rounding of a float64 sum).

Only the server half exists: it reads τ_k from ``update.metrics["local_steps"]``, which
:meth:`fedsim.client.base.Client.fit` reports. This class implements the paper's a_k for vanilla SGD only. With
momentum ρ the paper's ‖a_k‖₁ is [τ_k − ρ(1 − ρ^τ_k)/(1 − ρ)] / (1 − ρ), with a proximal term μ (FedProx)
[1 − (1 − ημ)^τ_k] / (ημ); here τ_k is used whatever the client optimiser, so with momentum, a proximal term
or an adaptive optimiser the normalisation is only an approximation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fedsim.core.checks import number
from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import Strategy


def local_steps(update: ClientUpdate) -> float:
    """τ_k of one client, from the metric that :meth:`fedsim.client.base.Client.fit` reports; > 0 unless the
    client holds no examples (weight 0: it is not read)."""
    try:
        steps = float(update.metrics["local_steps"])
    except KeyError as missing:
        raise ValueError(
            f"FedNova needs the metric {missing} in every update (fedsim.Client.fit reports it; "
            "a custom fit must report it too)"
        ) from None
    if update.num_examples > 0 and not (steps > 0 and math.isfinite(steps)):
        raise ValueError(f"FedNova needs local_steps > 0 (client {update.client_id} reported {steps})")
    return steps


def normalised_average(
    global_params: torch.Tensor, updates: Sequence[ClientUpdate], steps: Sequence[float]
) -> tuple[torch.Tensor, float]:
    """Σ_k p_k d_k (float64) and τ_eff = Σ_k p_k τ_k, folded in the given order; clients without examples
    weigh nothing."""
    total = float(sum(u.num_examples for u in updates))
    if not total > 0:
        raise ValueError(f"FedNova needs updates holding examples (total num_examples is {total})")
    start = global_params.double()
    direction = torch.zeros_like(start)
    tau_eff = 0.0
    for update, tau in zip(updates, steps, strict=True):
        if update.num_examples == 0:
            continue
        p = update.num_examples / total
        direction.add_((start - update.params.double()) / tau, alpha=p)
        tau_eff += p * tau
    return direction, tau_eff


class FedNova(Strategy):
    """w ← w − η_g · τ_eff · Σ_k p_k (w − w_k) / τ_k. Keeps stragglers: weighing their fewer steps right is
    the point of the method."""

    keeps_stragglers = True

    def __init__(self, *, server_lr: float = 1.0) -> None:
        number("strategy.server_lr", server_lr, above=0)
        self.server_lr = server_lr
        self.tau_eff = math.nan  # of the round last aggregated

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        steps = [local_steps(u) for u in updates]  # every update checked before anything changes
        direction, tau_eff = normalised_average(global_params, updates, steps)
        self.tau_eff = tau_eff
        return (global_params.double() - self.server_lr * tau_eff * direction).to(global_params.dtype)

    def round_metrics(self, round_num: int) -> dict[str, float]:
        """``tau_eff``: Σ_k p_k τ_k of the round, the number of local steps the aggregate stands for."""
        return {"tau_eff": self.tau_eff}
