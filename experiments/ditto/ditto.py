"""Ditto: a personal model per client next to the global one, kept in client state.

Li, Hu, Beirami, Smith. "Ditto: Fair and Robust Federated Learning Through Personalization." ICML 2021.

In every round it takes part in, a client (1) trains its copy of the global model w as FedAvg does and
sends that back, and (2) trains its personal model v on its own data, minimising
f(v) + λ/2·‖v − w‖², where w is the round's global model (the weights the task started from). v lives in
the client's state (``state["personal"]``, a flat tensor as made by :func:`fedsim.params.flatten`), never on
``self``: the server commits it only when it accepts the update. Runs with any aggregation rule:

    PYTHONPATH=experiments/ditto python -m fedsim client._target_=ditto.DittoClient +client.lam=0.1
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsim.client import Client
from fedsim.data.tensor_data import TensorData
from fedsim.params import flatten, load_flat
from fedsim.strategy.base import LocalTraining
from fedsim.types import ClientUpdate


class DittoClient(Client):
    """A :class:`~fedsim.client.Client` that also trains a personal model (Ditto's Algorithm 1, client side).

    ``lam`` (λ ≥ 0): how strongly v is pulled towards the global model (0: purely local training).
    ``personal_epochs``: epochs over the local data for v per round (``None``: the round's ``epochs``).
    Reports, besides FedAvg's metrics, ``personal_train_loss`` (mean data loss of v's steps) and, for a
    client with a local test split, ``personal_loss`` and ``personal_accuracy`` of v on that split; a
    client without one leaves these two out, so ``fit/personal_*`` average over clients that have one.
    """

    def __init__(
        self,
        client_id: int,
        train_indices: Sequence[int] | np.ndarray,
        test_indices: Sequence[int] | np.ndarray = (),
        *,
        lam: float = 0.1,
        personal_epochs: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(client_id, train_indices, test_indices, **kwargs)
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not lam >= 0:
            raise ValueError(f"client.lam must be a number >= 0 (got {lam!r})")
        bad_epochs = isinstance(personal_epochs, bool) or not isinstance(personal_epochs, int) or personal_epochs < 1
        if personal_epochs is not None and bad_epochs:
            raise ValueError(f"client.personal_epochs must be an integer >= 1 or null (got {personal_epochs!r})")
        self.lam, self.personal_epochs = float(lam), personal_epochs

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
        """FedAvg's local training of the global copy (returned), then the personal model's epochs."""
        config, state = dict(config or {}), {} if state is None else state
        start = flatten(model)  # w: the round's global weights
        anchor = [p.detach().clone() for p in model.parameters()]
        update = super().fit(
            model, data, config=config, generator=generator, round_num=round_num, local=local, state=state
        )
        load_flat(model, state.get("personal", start))  # v: last accepted round's personal model, or w the first time
        optimizer = self.make_optimizer(model, config)
        epochs = self.personal_epochs or int(config.get("epochs", self.epochs))
        batch_size = int(config.get("batch_size", self.batch_size))
        model.train()
        losses = [self._personal_epoch(model, optimizer, anchor, data, batch_size, generator) for _ in range(epochs)]
        state["personal"] = flatten(model)
        metrics = {**update.metrics, "personal_train_loss": sum(losses) / len(losses)}
        if self.test_indices.size:
            result = self.evaluate(model, data)
            metrics |= {"personal_loss": result["loss"], "personal_accuracy": result["accuracy"]}
        return replace(update, metrics=metrics, state=state)  # params: the global copy's weights

    def _personal_epoch(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        anchor: list[torch.Tensor],
        data: TensorData,
        batch_size: int,
        generator: torch.Generator,
    ) -> float:
        """One pass over the local data in an order drawn from ``generator``; returns the mean data loss."""
        device = next(model.parameters()).device
        order = torch.from_numpy(self.train_indices)[torch.randperm(self.num_train, generator=generator)].to(
            data.x.device
        )
        total = 0.0
        for begin in range(0, self.num_train, batch_size):
            idx = order[begin : begin + batch_size]
            total += float(
                self.personal_step(model, optimizer, anchor, data.x[idx].to(device), data.y[idx].to(device))
            ) * len(idx)
        return total / self.num_train if self.num_train else math.nan

    def personal_step(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        anchor: list[torch.Tensor],
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> torch.Tensor:
        """One step on f(v) + λ/2·‖v − w‖²: the batch loss's gradient plus λ(v − w), then ``optimizer.step()``.
        ``anchor`` holds w, one tensor per ``model.parameters()``. Returns the batch's data loss (detached)."""
        optimizer.zero_grad(set_to_none=True)
        loss = self.loss(model, x, y)
        loss.backward()
        with torch.no_grad():
            for v, w in zip(model.parameters(), anchor, strict=True):
                if v.grad is None:
                    v.grad = torch.zeros_like(v)
                v.grad.add_(v - w, alpha=self.lam)
        optimizer.step()
        return loss.detach()
