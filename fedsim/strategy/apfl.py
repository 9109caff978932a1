"""APFL: a personal model v mixed with the global one, both stepping on every batch.

Deng, Kamani, Mahdavi. "Adaptive Personalized Federated Learning." arXiv:2003.13461, 2020, Algorithm 1 and the
adaptive α of its Section 3. On every batch ξ of its local steps, client i, with learning rate η (the round's):

    v̄ = α v + (1 − α) w                                   (the personalised model)
    w ← w − η ∇f_i(w; ξ)                                   (the client's usual step: the global update)
    v ← v − η ∇_v f_i(v̄; ξ)  = v − η α ∇f_i(v̄; ξ)
    α ← α − η ∇_α f_i(v̄; ξ)  = α − η ⟨v − w, ∇f_i(v̄; ξ)⟩   (only with ``adapt_alpha``; kept in [0, 1])

all three from the values before the batch (v and α by autograd through v̄, w detached). The server averages the
clients' w weighted by their examples (FedAvg; the paper's uniform mean when the sizes are equal). v_i and α_i
are the client's state (``state["apfl_personal"]``: ``{parameter name: tensor}``; ``state["apfl_alpha"]``: a
float), committed only for accepted updates and checkpointed; the client's personal model for evaluation is
α_i v_i + (1 − α_i) w with the global w (``eval_personal/...`` with ``evaluate_clients``). As in Ditto, v_i
starts from the global model of the client's first round. v steps by plain SGD whatever the client's optimizer;
buffers (BatchNorm statistics) are the global model's. ``executor=vmap`` refuses APFL (per-batch second model).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fedsim.client.local_training import Batch
from fedsim.client.task_trainer import TaskTrainer
from fedsim.core.checks import within
from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import LocalTraining, Strategy
from fedsim.strategy.functional import weighted_average

PERSONAL_KEY = "apfl_personal"  # v_i: {parameter name: tensor}, in the client's state
ALPHA_KEY = "apfl_alpha"  # α_i, a float, in the client's state


class Mixture(LocalTraining):
    """Client half: on every batch, before the client's step on w, a step of v (and of α if adapted)."""

    def __init__(self, alpha: float, adapt_alpha: bool) -> None:
        self.alpha, self.adapt_alpha = alpha, adapt_alpha

    def begin_task(self, model: nn.Module, config: dict[str, Any], state: dict[str, Any]) -> None:
        if PERSONAL_KEY not in state:  # the client's first round: v starts as w^t, α as configured
            state[PERSONAL_KEY] = {n: p.detach().clone() for n, p in model.named_parameters()}
            state[ALPHA_KEY] = self.alpha

    def on_batch(self, batch: Batch) -> None:
        w = {n: p.detach() for n, p in batch.model.named_parameters()}
        v = {n: t.detach().to(w[n].device).requires_grad_() for n, t in batch.state[PERSONAL_KEY].items()}
        dtype, device = next(iter(w.values())).dtype, next(iter(w.values())).device
        alpha = torch.tensor(batch.state[ALPHA_KEY], dtype=dtype, device=device, requires_grad=self.adapt_alpha)
        loss = batch.loss({n: alpha * v[n] + (1 - alpha) * w[n] for n in w})
        inputs = [*v.values(), alpha] if self.adapt_alpha else list(v.values())
        grads = torch.autograd.grad(loss, inputs)  # α ∇f(v̄) for each part of v, then ⟨v − w, ∇f(v̄)⟩ for α
        with torch.no_grad():
            batch.state[PERSONAL_KEY] = {n: v[n] - batch.lr * g for n, g in zip(v, grads, strict=False)}
        if self.adapt_alpha:
            stepped = batch.state[ALPHA_KEY] - batch.lr * float(grads[-1])
            batch.state[ALPHA_KEY] = min(max(stepped, 0.0), 1.0)

    def after_training(self, trainer: TaskTrainer, state: dict[str, Any]) -> None:
        trainer.metrics["apfl_alpha"] = float(state[ALPHA_KEY])  # logged as fit/apfl_alpha

    def personalise(self, model: nn.Module, state: dict[str, Any]) -> bool:
        if PERSONAL_KEY not in state:
            return False
        alpha, v = float(state[ALPHA_KEY]), state[PERSONAL_KEY]
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(alpha * v[name].to(p.device) + (1 - alpha) * p)
        return True


class APFL(Strategy):
    """FedAvg for the global model w; each client keeps a personal model v and a mixing weight α (client half)."""

    keeps_stragglers = False  # the global model is FedAvg's

    def __init__(self, *, alpha: float = 0.5, adapt_alpha: bool = False) -> None:
        within("strategy.alpha", alpha, "[0, 1]", hint=": the weight of the personal model")
        self.alpha, self.adapt_alpha = float(alpha), bool(adapt_alpha)

    def local_training(self) -> LocalTraining:
        return Mixture(self.alpha, self.adapt_alpha)

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        return weighted_average([u.params for u in updates], [u.num_examples for u in updates])
