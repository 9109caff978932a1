"""Ditto: a personal model per client, pulled towards the global model, next to plain FedAvg.

Li, Hu, Beirami, Smith. "Ditto: Fair and Robust Federated Learning Through Personalization." ICML 2021,
Algorithm 1. In every round it takes part in, client k

    1. trains its copy of the global model w^t as FedAvg's clients do and sends it back (the global update);
    2. trains its personal model v_k for ``personal_epochs`` epochs on its own data (null: as long as the global
       update, its epochs or its ``client.local_steps``), minimising
       F_k(v) + λ/2 ‖v − w^t‖², i.e. every step  v ← v − η (∇F_k(v) + λ (v − w^t)),
       with the same optimizer settings and batch size, batches drawn from the task's generator after the
       global update's (so the task stays a pure function of its seed).

    server:  w^{t+1} = Σ_k (n_k / n) w_k   (FedAvg)

v_k is the client's state (``state["ditto_personal"]``, a flat tensor laid out as the global weights), committed
only when the server accepts the update, checkpointed, and evaluated as the client's personal model
(``eval_personal/...`` with ``evaluate_clients``). The paper starts every v_k at w⁰; here v_k starts from the
global model of the client's first round, which with partial participation is what the client can have (a
client sampled first in round 50 would otherwise begin from the untrained model). λ = 0 trains a purely local
model; a large λ keeps v_k at the global model. ``executor=vmap`` refuses Ditto (the personal epochs are a
second training loop); use ``executor=process``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fedsim.client.task_trainer import TaskTrainer
from fedsim.core.checks import number
from fedsim.core.params import flatten, load_flat
from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import LocalTraining, Strategy, gradients
from fedsim.strategy.functional import weighted_average

STATE_KEY = "ditto_personal"  # v_k, flat, in the client's state


class PersonalModel(LocalTraining):
    """Client half: after the global update, ``personal_epochs`` epochs of v_k with the pull λ (v_k − w^t)."""

    def __init__(self, lam: float, personal_epochs: int | None) -> None:
        self.lam, self.personal_epochs = lam, personal_epochs
        self.anchor: list[torch.Tensor] = []  # w^t's trained parameters, for the task in progress
        self.start = torch.zeros(0)  # w^t as a flat vector: v_k's first value

    def begin_task(self, model: nn.Module, config: dict[str, Any], state: dict[str, Any]) -> None:
        self.anchor = [p.detach().clone() for p in model.parameters() if p.requires_grad]
        if STATE_KEY not in state:  # the client's first round: v_k starts as w^t
            self.start = flatten(model)

    def after_training(self, trainer: TaskTrainer, state: dict[str, Any]) -> None:
        load_flat(trainer.model, state.get(STATE_KEY, self.start))
        if self.personal_epochs is None:  # as long as the global update: its epochs, or its local steps
            losses = trainer.run_local(before_step=self._pull)
        else:
            losses = trainer.run_epochs(self.personal_epochs, before_step=self._pull)
        state[STATE_KEY] = flatten(trainer.model)
        trainer.metrics["personal_train_loss"] = sum(losses) / len(losses)

    def _pull(self, model: nn.Module) -> None:
        """Add λ (v − w^t) to the step's gradients: the gradient of λ/2 ‖v − w^t‖²."""
        if self.lam == 0.0:
            return
        params, grads = gradients(model)
        with torch.no_grad():
            torch._foreach_add_(grads, torch._foreach_sub(params, self.anchor), alpha=self.lam)

    def personalise(self, model: nn.Module, state: dict[str, Any]) -> bool:
        if STATE_KEY not in state:
            return False
        load_flat(model, state[STATE_KEY])
        return True


class Ditto(Strategy):
    """FedAvg for the global model; each client also keeps and trains a personal model (client half)."""

    keeps_stragglers = False  # the global model is FedAvg's

    def __init__(self, *, lam: float = 0.1, personal_epochs: int | None = None) -> None:
        number("strategy.lam", lam, at_least=0)
        if personal_epochs is not None and personal_epochs < 1:
            raise ValueError(
                f"strategy.personal_epochs must be >= 1 or null (got {personal_epochs}); null: the round's local epochs"
            )
        self.lam, self.personal_epochs = lam, personal_epochs

    def local_training(self) -> LocalTraining:
        return PersonalModel(self.lam, self.personal_epochs)

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        return weighted_average([u.params for u in updates], [u.num_examples for u in updates])
