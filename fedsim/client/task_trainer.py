"""TaskTrainer: what a strategy's client half may use inside a task beyond the standard local epochs.

:meth:`~fedsim.client.local_training.LocalTraining.before_training` and
:meth:`~fedsim.client.local_training.LocalTraining.after_training` receive one. It trains the task's model for more
epochs with the client's own loop (same optimizer settings, batch size and loss; batches drawn from the task's
generator, so everything stays a pure function of the task seed), freezes parameters by name, and measures
the model's loss on the client's training data. Algorithms that need it: FedRep (head epochs with the body
frozen), Ditto (the personal model's epochs), q-FFL (the loss of the global model before training).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from fedsim.client.scoring import example_losses
from fedsim.data.tensor_data import TensorData


class TaskClient(Protocol):
    """What a :class:`TaskTrainer` uses of its client (a :class:`fedsim.client.Client`): its batch size, training
    rows, optimizer, one local epoch, its loss per example and per batch. Typed structurally so that this module,
    which the client imports, does not import the client back."""

    batch_size: int
    epochs: int  # its default local epochs (Ditto reads them)
    train_indices: np.ndarray

    def _local_work(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        data: TensorData,
        config: dict[str, Any],
        generator: torch.Generator,
    ) -> tuple[list[float], int]: ...

    def make_optimizer(self, model: nn.Module, config: dict[str, Any]) -> torch.optim.Optimizer:
        """This round's optimizer (:meth:`fedsim.client.Client.make_optimizer`)."""
        ...

    def _run_epoch(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        data: TensorData,
        batch_size: int,
        generator: torch.Generator,
        device: torch.device,
    ) -> float: ...

    def per_example_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Every example's loss (:meth:`fedsim.client.Client.per_example_loss`)."""
        ...

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One batch's training loss (:meth:`fedsim.client.Client.loss`)."""
        ...

    def train_step(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
    ) -> float | torch.Tensor:
        """One optimisation step on one batch (:meth:`fedsim.client.Client.train_step`)."""
        ...


@dataclass
class TaskTrainer:
    """The running task: its client, model (on the worker's device), training data, config and generator.

    ``metrics``: scalars to add to the update's metrics (logged as ``fit/<name>``, example-weighted over the
    round's clients)."""

    client: TaskClient
    model: nn.Module
    data: TensorData
    config: dict[str, Any]
    generator: torch.Generator
    metrics: dict[str, float] = field(default_factory=dict)

    def run_epochs(self, epochs: int, *, before_step: Callable[[nn.Module], None] | None = None) -> list[float]:
        """Train :attr:`model` in place for ``epochs`` passes over the client's training data, with a fresh
        optimizer built as for the local epochs (the round's ``lr`` included) and the round's batch size; returns
        each epoch's mean loss. ``before_step(model)`` runs before every optimizer step, once the batch's
        gradients are in ``.grad`` (add a term's gradient there, see :func:`~fedsim.client.local_training.gradients`).
        Frozen parameters (:meth:`freeze`) are not trained."""
        batch_size = int(self.config.get("batch_size", self.client.batch_size))
        device = next(self.model.parameters()).device
        optimizer = self.client.make_optimizer(self.model, self.config)
        if before_step is not None:
            optimizer.register_step_pre_hook(lambda _optimizer, _args, _kwargs: before_step(self.model))
        self.model.train()
        return [
            self.client._run_epoch(self.model, optimizer, self.data, batch_size, self.generator, device)
            for _ in range(epochs)
        ]

    def run_local(self, *, before_step: Callable[[nn.Module], None] | None = None) -> list[float]:
        """Train :attr:`model` in place for as long as the task's local training: its epochs, or its
        ``local_steps`` when the client or the round sets them (see :class:`~fedsim.client.base.Client`), with a fresh
        optimizer and ``before_step`` as :meth:`run_epochs`; returns each pass's mean loss (Ditto's personal model
        when ``personal_epochs`` is null)."""
        optimizer = self.client.make_optimizer(self.model, self.config)
        if before_step is not None:
            optimizer.register_step_pre_hook(lambda _optimizer, _args, _kwargs: before_step(self.model))
        self.model.train()
        return self.client._local_work(self.model, optimizer, self.data, self.config, self.generator)[0]

    def freeze(self, names: Collection[str]) -> None:
        """Stop training the named parameters (``requires_grad=False``) until the task ends: the client puts every
        parameter's ``requires_grad`` back after the task. ``unfreeze`` undoes it within the task."""
        self._set_trainable(names, False)

    def unfreeze(self, names: Collection[str]) -> None:
        """Train the named parameters again."""
        self._set_trainable(names, True)

    def _set_trainable(self, names: Collection[str], trainable: bool) -> None:
        wanted = set(names)
        for name, parameter in self.model.named_parameters():
            if name in wanted:
                parameter.requires_grad_(trainable)

    @torch.no_grad()
    def data_loss(self) -> float:
        """Mean per-example loss (the client's :meth:`~fedsim.client.base.Client.per_example_loss`) of :attr:`model`
        as it is now on the client's training examples, in evaluation mode, summed in float64; no training, no random
        draw."""
        losses, _ = example_losses(self.client, self.model, self.data, torch.from_numpy(self.client.train_indices))
        return float(losses.double().sum()) / max(losses.numel(), 1)
