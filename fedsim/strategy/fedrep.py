"""FedRep: a shared representation learned federatedly, a personal head trained first on each client.

Collins, Hassani, Mokhtari, Shakkottai. "Exploiting Shared Representations for Personalized Federated Learning."
ICML 2021, Algorithm 1. The model is a representation φ (the body) and a head h (the last layer). In every round it
takes part in, client k

    1. loads its own head h_k (the global model's head, the first time) and trains the head alone, the body frozen,
       for ``head_epochs`` epochs;
    2. then trains the body alone, its new head frozen, for the round's local epochs, and sends the body back;
       h_k stays in its client state.

    server:  φ^{t+1} = Σ_k (n_k / n) φ_k;   the global model's head stays as it was (as FedPer's)

The head is chosen as in :class:`~fedsim.strategy.fedper.FedPer`: ``personal_layers`` is a regular expression over
``state_dict`` entry names; ``None`` keeps the model's last layer personal. The difference from FedPer is the
order and split of local training (FedPer trains everything at once). The paper uses many head epochs and few
body epochs (e.g. 10 and 1). Evaluation of the personal models (``eval_personal/``) uses each client's own head on
the global body. ``executor=vmap`` refuses FedRep (its two phases are not one vectorised loop).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fedsim.client.task_trainer import TaskTrainer
from fedsim.core.checks import integer
from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import LocalTraining, Strategy
from fedsim.strategy.context import RunContext
from fedsim.strategy.fedper import FedPer, PersonalLayers


class HeadThenBody(LocalTraining):
    """Client half: own head in; head epochs with the body frozen; body epochs with the head frozen; head out."""

    def __init__(self, head: Sequence[str], body: Sequence[str], head_epochs: int) -> None:
        self.head = PersonalLayers(head)  # loads and keeps the head entries (buffers included)
        self.body, self.head_epochs = tuple(body), head_epochs

    def begin_task(self, model: nn.Module, config: dict[str, Any], state: dict[str, Any]) -> None:
        self.head.begin_task(model, config, state)

    def before_training(self, trainer: TaskTrainer, state: dict[str, Any]) -> None:
        trainer.freeze(self.body)
        losses = trainer.run_epochs(self.head_epochs)
        trainer.metrics["head_train_loss"] = sum(losses) / len(losses)
        trainer.unfreeze(self.body)
        trainer.freeze(self.head.names)  # the local epochs that follow train the body alone

    def end_task(self, model: nn.Module, config: dict[str, Any], state: dict[str, Any]) -> None:
        self.head.end_task(model, config, state)

    def personalise(self, model: nn.Module, state: dict[str, Any]) -> bool:
        return self.head.personalise(model, state)


class FedRep(Strategy):
    """FedAvg on the body; each client's head stays with it and is trained before the body every round."""

    keeps_stragglers = False

    def __init__(self, *, personal_layers: str | None = None, head_epochs: int = 10) -> None:
        integer("strategy.head_epochs", head_epochs, 1)
        self.split = FedPer(personal_layers=personal_layers)  # which entries are the head; averaging the rest
        self.personal_layers, self.head_epochs = personal_layers, head_epochs
        self.body: tuple[str, ...] = ()

    def setup(self, context: RunContext) -> None:
        self.split.setup(context)
        self.body = tuple(name for name in context.layout.names if name not in self.split.names)

    def personal_entries(self) -> torch.Tensor | None:
        """The head: never uploaded (None before :meth:`setup`)."""
        return self.split.personal

    def local_training(self) -> LocalTraining:
        if not self.body:
            raise RuntimeError("FedRep.local_training called before setup(); the Server calls setup() first")
        return HeadThenBody(self.split.names, self.body, self.head_epochs)

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        return self.split.aggregate(round_num, global_params, updates)

    def round_metrics(self, round_num: int) -> dict[str, float]:
        return self.split.round_metrics(round_num)
