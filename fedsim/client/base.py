"""Client: an id, its data (indices into a shared dataset) and how it trains locally. It holds no model.

A worker owns one model per device, loads the global weights into it and calls ``client.fit``.
To customise local training, subclass ``Client`` and override :meth:`Client.loss` (e.g. a
regulariser) or :meth:`Client.train_step` (e.g. gradient clipping, a second forward pass).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsim.client.local_training import BatchSteps, LocalTraining, hook_before_step, overrides_on_batch
from fedsim.client.schedule import LrSchedule
from fedsim.client.scoring import evaluate_indices
from fedsim.client.task_trainer import TaskTrainer
from fedsim.core.checks import integer
from fedsim.core.params import flatten
from fedsim.core.types import ClientUpdate
from fedsim.data.tensor_data import TensorData

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


AUTOCAST = {None: None, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""What ``client.autocast`` takes: the dtype of ``torch.autocast`` around :meth:`Client.objective`."""


def default_optimizer() -> OptimizerFactory:
    """Plain SGD with learning rate 0.01, as in McMahan et al. 2017."""
    return functools.partial(torch.optim.SGD, lr=0.01)


class Client:
    """One participant of the federation.

    ``train_indices`` and ``test_indices`` index into the shared training dataset (the client's
    local test split lives inside the training set, away from the centralized test set).
    ``optimizer`` builds a fresh optimizer over the model's parameters for every ``fit`` call.
    ``config`` keys from the strategy (``epochs``, ``local_steps``, ``batch_size``, ``lr``) override the defaults for
    one round; a strategy may add its own keys and a matching client subclass may read them.

    ``local_steps``: when set, every task trains exactly that many batches (optimizer steps) whatever the client's
    size, and ``epochs`` is not read: batches are cut from passes over the client's training indices, each pass a
    fresh shuffle drawn from the task's generator (as an epoch's), its last batch possibly smaller; once a pass is
    used up the next one is drawn, and the task stops after the K-th batch, in the middle of a pass if need be. So
    K = E · ⌈n / B⌉ trains exactly as E epochs do, and the batches are a pure function of (seed, round, client).
    ``lr_schedule``: the learning rate of every round (:class:`~fedsim.client.schedule.LrSchedule`; the server
    computes it and sends it as the task config's ``lr``); ``None`` is constant.
    ``autocast`` (``"bfloat16"``, ``"float16"``; None: off) runs :meth:`objective`, the forward pass and the loss,
    under ``torch.autocast`` on the model's device; the backward pass and the optimizer step stay outside it.
    """

    task_attributes: tuple[str, ...] = ()
    """Attributes that a subclass sets during a task and that only mean something within it (e.g. the weights
    the task started from, read by an overridden :meth:`loss`): they are put back after every task. Any other
    attribute a task changes is an error (keep values across rounds in client state, see :meth:`fit`)."""

    def __init__(
        self,
        client_id: int,
        train_indices: Sequence[int] | np.ndarray,
        test_indices: Sequence[int] | np.ndarray = (),
        *,
        epochs: int = 1,
        batch_size: int = 10,
        optimizer: OptimizerFactory | None = None,
        local_steps: int | None = None,
        lr_schedule: LrSchedule | None = None,
        autocast: str | None = None,
    ) -> None:
        integer("client.epochs", epochs, 1)
        if local_steps is not None:
            integer("client.local_steps", local_steps, 1, hint="; null: client.epochs")
        integer("client.batch_size", batch_size, 1)
        if autocast not in AUTOCAST:
            raise ValueError(f"client.autocast must be null, bfloat16 or float16 (got {autocast!r})")
        self.autocast = autocast
        self.client_id = int(client_id)
        # numpy, not torch: a client pickles as plain bytes (a CPU tensor would claim a shared-memory
        # segment per client when sent to worker processes)
        self.train_indices = np.ascontiguousarray(train_indices, dtype=np.int64)
        self.test_indices = np.ascontiguousarray(test_indices, dtype=np.int64)
        self.epochs = epochs
        self.batch_size = batch_size
        self.optimizer = optimizer or default_optimizer()
        self.local_steps = local_steps
        self.lr_schedule = lr_schedule
        self._local: LocalTraining | None = None
        self._batches: BatchSteps | None = None  # the strategy's per-batch hook, during the local epochs only

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(id={self.client_id}, train={len(self.train_indices)}, "
            f"test={len(self.test_indices)})"
        )

    @property
    def num_train(self) -> int:
        """How many training examples the client holds (the FedAvg weight of its update)."""
        return int(self.train_indices.size)

    # --- overridable pieces -------------------------------------------------------------------
    def per_example_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Loss of every example of a batch (cross-entropy). Override this for another per-example loss:
        it is what both :meth:`loss` and ``executor=vmap`` use (under vmap it must not read ``self``'s
        per-client state: the first client of a chunk's method computes every client's loss). With token labels
        (``y`` of shape ``[B, T]``, -100 where no loss is taken): each example's mean over its scored tokens."""
        if y.ndim == 1:
            return nn.functional.cross_entropy(logits, y, reduction="none")
        tokens = nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction="none")  # 0 where y is -100
        return tokens.sum(dim=1) / (y != -100).sum(dim=1).clamp(min=1)

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Training loss of one batch: the mean of :meth:`per_example_loss`. Override to add terms
        (then ``executor=vmap`` refuses the client; use ``executor=process``). With token labels: the mean over
        the batch's scored tokens (not over examples)."""
        if y.ndim == 1:
            return self.per_example_loss(model(x), y).mean()
        return nn.functional.cross_entropy(model(x).transpose(1, 2), y)  # ignore_index=-100 is the default

    def objective(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """What a step minimises: :meth:`loss` plus the strategy's client-side term (e.g. FedProx's).

        An overridden :meth:`train_step` should call this rather than :meth:`loss`. Under ``autocast``, both run in
        ``torch.autocast``.
        """
        if self.autocast is not None:
            with torch.autocast(device_type=x.device.type, dtype=AUTOCAST[self.autocast]):
                return self._objective(model, x, y)
        return self._objective(model, x, y)

    def _objective(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = self.loss(model, x, y)
        term = self._local.loss_term(model) if self._local is not None else None
        return loss if term is None else loss + term

    def train_step(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
    ) -> float | torch.Tensor:
        """One optimisation step on one batch; returns the batch objective, as a float or a detached 0-d
        tensor (the default: a float would wait for a GPU to finish every step)."""
        optimizer.zero_grad(set_to_none=True)
        loss = self.objective(model, x, y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    def make_optimizer(self, model: nn.Module, config: dict[str, Any]) -> torch.optim.Optimizer:
        """Build this round's optimizer; a ``lr`` in the round config overrides the factory's."""
        optimizer = self.optimizer(model.parameters())
        if "lr" in config:
            for group in optimizer.param_groups:
                group["lr"] = float(config["lr"])
        return optimizer

    # --- the two entry points -----------------------------------------------------------------
    def fit(
        self,
        model: nn.Module,
        data: TensorData,
        *,
        config: dict[str, Any] | None = None,
        generator: torch.Generator,
        round_num: int = 0,
        local: LocalTraining | None = None,
        state: dict[str, Any] | None = None,
    ) -> ClientUpdate:
        """Train ``model`` in place on this client's data and return its weights as an update.

        Every random choice (batch order) comes from ``generator``, never from the global RNG, so the
        result depends only on the global weights, the data and the generator's seed. ``local`` is the
        strategy's client half (see :class:`~fedsim.client.local_training.LocalTraining`), if it has one.

        ``state`` is this client's state (a private copy, see :mod:`fedsim.client.state`): an override
        that keeps values across rounds (a counter, a personal model) reads and changes this dict, never
        ``self``, which must be the same at the start of every task. What ``state`` holds when ``fit``
        returns becomes the client's new state if the server accepts the update.
        """
        config = dict(config or {})
        state = {} if state is None else state
        self._local = local
        trainable = [p.requires_grad for p in model.parameters()]
        try:
            if local is None:
                return self._train(model, data, config, generator, round_num, local)
            trainer = TaskTrainer(self, model, data, config, generator)
            local.begin_task(model, config, state)
            local.before_training(trainer, state)
            self._batches = self._batch_steps(local, state)
            update = self._train(model, data, config, generator, round_num, local)
            self._batches = None
            local.after_training(trainer, state)
            local.end_task(model, config, state)
            return replace(update, metrics={**update.metrics, **trainer.metrics}) if trainer.metrics else update
        finally:
            self._local = None  # a Client is the same after a task as before it, and so is the model's trainability
            self._batches = None
            for parameter, flag in zip(model.parameters(), trainable, strict=True):
                parameter.requires_grad_(flag)

    def _batch_steps(self, local: LocalTraining, state: dict[str, Any]) -> BatchSteps | None:
        """The runner of ``local``'s per-batch hook for this task, or ``None`` when it has none; refuses a client
        whose own epoch loop (DP-SGD's) would skip it."""
        if not overrides_on_batch(local):
            return None
        if type(self)._run_epoch is not Client._run_epoch:
            raise TypeError(
                f"{type(local).__name__} steps on every batch (on_batch) but {type(self).__name__} has its own epoch "
                "loop that would skip it: use client=sgd or client=adam"
            )
        return BatchSteps(local, state)

    def _train(
        self,
        model: nn.Module,
        data: TensorData,
        config: dict[str, Any],
        generator: torch.Generator,
        round_num: int,
        local: LocalTraining | None,
    ) -> ClientUpdate:
        """The local epochs (or local steps) of :meth:`fit` and the update they produce."""
        device = next(model.parameters()).device
        optimizer = self.make_optimizer(model, config)
        hook_before_step(local, model, optimizer)
        model.train()
        epoch_losses, steps = self._local_work(model, optimizer, data, config, generator)
        return ClientUpdate(
            client_id=self.client_id,
            round_num=round_num,
            params=flatten(model),
            num_examples=self.num_train,
            metrics={
                "train_loss": sum(epoch_losses) / max(len(epoch_losses), 1),
                "local_steps": float(steps),
                "lr": float(optimizer.param_groups[0]["lr"]),
            },
            epoch_losses=tuple(epoch_losses),
            device=str(device),
        )

    def task_steps(self, config: dict[str, Any]) -> int | None:
        """The task's local steps K (the config's ``local_steps``, else the client's), or ``None``: it trains epochs."""
        steps = config.get("local_steps", self.local_steps)
        return None if steps is None else int(steps)

    def _local_work(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        data: TensorData,
        config: dict[str, Any],
        generator: torch.Generator,
    ) -> tuple[list[float], int]:
        """The task's local training with ``optimizer``: its epochs, or its K local steps (see the class docstring);
        returns each pass's mean loss and the number of batches trained."""
        batch_size = int(config.get("batch_size", self.batch_size))
        device = next(model.parameters()).device
        per_pass = math.ceil(self.num_train / batch_size)
        steps = self.task_steps(config)
        if steps is None:
            epochs = int(config.get("epochs", self.epochs))
            losses = [self._run_epoch(model, optimizer, data, batch_size, generator, device) for _ in range(epochs)]
            return losses, epochs * per_pass
        if type(self)._run_epoch is not Client._run_epoch:
            raise TypeError(
                f"client.local_steps: {type(self).__name__} has its own epoch loop (_run_epoch), which cannot stop "
                "after K batches; set client.epochs instead"
            )
        losses, left = [], steps if per_pass else 0
        while left > 0:
            losses.append(self._run_pass(model, optimizer, data, batch_size, generator, device, min(left, per_pass)))
            left -= per_pass
        return losses, steps if per_pass else 0

    def _run_epoch(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        data: TensorData,
        batch_size: int,
        generator: torch.Generator,
        device: torch.device,
    ) -> float:
        """One pass over the client's shuffled training indices; returns the example-weighted mean loss."""
        per_pass = math.ceil(self.num_train / batch_size)
        return self._run_pass(model, optimizer, data, batch_size, generator, device, per_pass)

    def _run_pass(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        data: TensorData,
        batch_size: int,
        generator: torch.Generator,
        device: torch.device,
        batches: int,
    ) -> float:
        """The first ``batches`` batches of one pass over the client's shuffled training indices (a whole pass is an
        epoch); returns the example-weighted mean loss of the batches trained.

        Batch losses are summed in float64 where ``train_step`` leaves them (on a GPU: on the GPU), so the
        device is waited for once per pass, not once per step; the sum equals a Python float sum bit for bit.
        """
        order = torch.from_numpy(self.train_indices)[torch.randperm(self.num_train, generator=generator)]
        order = order.to(data.x.device)  # data already on the GPU: index it there, no copy per step
        total: float | torch.Tensor = 0.0
        seen = 0
        for start in range(0, min(self.num_train, batches * batch_size), batch_size):
            idx = order[start : start + batch_size]
            x, y = data.x[idx].to(device, non_blocking=True), data.y[idx].to(device, non_blocking=True)
            loss = (
                self.train_step(model, optimizer, x, y)
                if self._batches is None
                else self._batches.run(self, model, optimizer, x, y)
            )
            total = total + (loss.double() if isinstance(loss, torch.Tensor) else loss) * len(idx)
            seen += len(idx)
        return float(total) / max(seen, 1)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: TensorData, *, batch_size: int = 256) -> dict[str, float]:
        """Loss and accuracy of ``model`` on this client's local test split."""
        return evaluate_indices(model, data, torch.from_numpy(self.test_indices), batch_size=batch_size)
