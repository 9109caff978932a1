"""pFedMe: personalised models as Moreau envelopes, solved on every batch.

T Dinh, Tran, Nguyen. "Personalized Federated Learning with Moreau Envelopes." NeurIPS 2020, Algorithm 1. On every
batch D of its local steps, client i, with the round's learning rate η:

    θ ← θ − p (∇f_i(θ; D) + λ (θ − w))   K times (``inner_steps``; p: ``personal_lr``): θ̃ approximately solves
                                          min_θ f_i(θ; D) + λ/2 ‖θ − w‖², the Moreau-envelope sub-problem
    w ← w − η λ (w − θ̃)                   (replaces the client's usual step; taken by its optimizer with the
                                          gradient λ (w − θ̃), so with plain SGD exactly this)

    server:  w^{t+1} = (1 − β) w^t + β Σ_k (n_k / n) w_k      (β = 1: FedAvg)

θ starts every task at the round's global weights w^t and is warm-started from one batch to the next, as in the
authors' code; the paper averages clients uniformly, here by examples (the same when the sizes are equal). The
final θ̃ is the client's personal model: ``state["pfedme_personal"]`` (``{parameter name: tensor}``), committed
only for accepted updates, checkpointed and scored with ``evaluate_clients`` (``eval_personal/...``). The
reported training loss is f_i(θ; D) at the last inner step of each batch. Buffers (BatchNorm statistics) are the
global model's. Defaults λ = 15, K = 5, p = 0.01, β = 1 are those of FL-bench's pFedMe. ``executor=vmap``
refuses pFedMe (per-batch second model).

A client's personal model dates from its last participation: only the round's sampled clients train, so θ̃ of a
client that was not sampled this round is the one it computed from an older global model (a client never sampled
has none and is scored with the global model), and that is what ``evaluate_clients`` scores. In the paper's
Algorithm 1 the server sends w^t to every client every round, all N clients run the local update (so every θ_i is
computed from the latest w), and only the sampled subset's w_i are aggregated; that costs N local trainings a round.
The two agree when every client is sampled every round (``clients_per_round`` equal to the number of clients).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fedsim.client.local_training import Batch
from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import LocalTraining, Strategy
from fedsim.strategy.functional import weighted_average

PERSONAL_KEY = "pfedme_personal"  # θ_i: {parameter name: tensor}, in the client's state


class MoreauEnvelope(LocalTraining):
    """Client half: on every batch, K steps of θ on the Moreau-envelope sub-problem, then w's step towards θ."""

    def __init__(self, lam: float, personal_lr: float, inner_steps: int) -> None:
        self.lam, self.personal_lr, self.inner_steps = lam, personal_lr, inner_steps

    def begin_task(self, model: nn.Module, config: dict[str, Any], state: dict[str, Any]) -> None:
        state[PERSONAL_KEY] = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    def on_batch(self, batch: Batch) -> torch.Tensor:
        trained = {n: p for n, p in batch.model.named_parameters() if p.requires_grad}
        w = {n: p.detach() for n, p in trained.items()}
        theta = {n: t.to(w[n].device) for n, t in batch.state[PERSONAL_KEY].items()}
        loss = torch.zeros(())
        for _ in range(self.inner_steps):
            leaves = {n: t.detach().requires_grad_() for n, t in theta.items()}
            loss = batch.loss(leaves)
            grads = torch.autograd.grad(loss, list(leaves.values()))
            with torch.no_grad():
                theta = {
                    n: t - self.personal_lr * (g + self.lam * (t - w[n]))
                    for (n, t), g in zip(leaves.items(), grads, strict=True)
                }
        batch.state[PERSONAL_KEY] = theta
        for name, p in trained.items():
            p.grad = self.lam * (w[name] - theta[name])
        batch.optimizer.step()
        return loss.detach()

    def personalise(self, model: nn.Module, state: dict[str, Any]) -> bool:
        if PERSONAL_KEY not in state:
            return False
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name in state[PERSONAL_KEY]:
                    p.copy_(state[PERSONAL_KEY][name])
        return True


class PFedMe(Strategy):
    """The server's β-step towards the clients' average; each client solves pFedMe's sub-problem per batch."""

    keeps_stragglers = False  # an unfinished client's w is not the paper's

    def __init__(
        self, *, lam: float = 15.0, personal_lr: float = 0.01, inner_steps: int = 5, beta: float = 1.0
    ) -> None:
        if not lam > 0:
            raise ValueError(
                f"strategy.lam must be > 0 (got {lam}): the global model's step is lam (w - theta), so with lam = 0 "
                "it never moves"
            )
        if not personal_lr > 0:
            raise ValueError(f"strategy.personal_lr must be > 0 (got {personal_lr}): the step size of θ's K steps")
        if inner_steps < 1:
            raise ValueError(f"strategy.inner_steps must be >= 1 (got {inner_steps}): K, θ's steps per batch")
        if not beta > 0:
            raise ValueError(f"strategy.beta must be > 0 (got {beta}); beta=1 is FedAvg's server step")
        self.lam, self.personal_lr, self.inner_steps, self.beta = (
            float(lam),
            float(personal_lr),
            inner_steps,
            float(beta),
        )

    def local_training(self) -> LocalTraining:
        return MoreauEnvelope(self.lam, self.personal_lr, self.inner_steps)

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        average = weighted_average([u.params for u in updates], [u.num_examples for u in updates])
        if self.beta == 1.0:
            return average
        return (1 - self.beta) * global_params + self.beta * average
