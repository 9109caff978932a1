"""SCAFFOLD: stochastic controlled averaging, with server and client control variates.

Karimireddy, Kale, Mohri, Reddi, Stich, Suresh. "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning." ICML 2020. Algorithm 1 with option II for the client control update:

    client i:  y ← x;  K steps of  y ← y − η_l (g_i(y) − c_i + c)
               c_i⁺ = c_i − c + (x − y) / (K η_l)
    server:    x ← x + η_g · mean_i (y_i − x);   c ← c + (|S| / N) · mean_i (c_i⁺ − c_i)

Both halves live here. The gradient correction (c − c_i) is added to every step's gradients before
the optimizer step (under ``executor=vmap``: as the linear term ⟨c − c_i, y⟩, whose gradient it is). Client control variates live in a client-state
store (memory or disk) touched only for sampled clients; c_i⁺ is computed on the server from the
returned weights, the client's step count and learning rate, so nothing but the correction travels.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsim.state import ClientStateStore, make_store
from fedsim.strategy.base import LocalTraining, Strategy, gradients
from fedsim.types import ClientUpdate


class ControlCorrection(LocalTraining):
    """Client half: adds c − c_i to every step's gradients (the gradient of the linear term ⟨c − c_i, w⟩)."""

    def __init__(self) -> None:
        self.pieces: list[tuple[nn.Parameter, torch.Tensor]] = []

    def begin(self, model: nn.Module, config: dict[str, Any]) -> None:
        correction = torch.from_numpy(np.asarray(config["scaffold_correction"], dtype=np.float32))
        self.pieces = []
        if correction.numel() == 0:  # first round: c = c_i = 0, nothing to correct
            return
        device = next(model.parameters()).device
        offsets, offset = {}, 0
        for name, value in model.state_dict().items():
            if value.is_floating_point():
                offsets[name] = (offset, value.shape)
                offset += value.numel()
        for name, param in model.named_parameters():
            if not param.requires_grad:  # frozen: no gradient to correct (and not in gradients(model))
                continue
            start, shape = offsets[name]
            piece = correction[start : start + param.numel()].view(shape).to(device)
            self.pieces.append((param, piece))

    def before_step(self, model: nn.Module) -> None:
        if not self.pieces:
            return
        _, grads = gradients(model)
        with torch.no_grad():
            torch._foreach_add_(grads, [piece for _, piece in self.pieces])

    def functional_term(
        self, params: dict[str, torch.Tensor], anchor: dict[str, torch.Tensor], numbers: dict[str, Any]
    ) -> torch.Tensor | None:
        """The same term for ``executor=vmap``, which hands the correction over already split by parameter."""
        correction = numbers.get("scaffold_correction")
        if correction is None:  # first round: c = c_i = 0
            return None
        return sum((param * correction[name]).sum() for name, param in params.items())  # type: ignore[return-value]


def _steps_times_lr(update: ClientUpdate) -> float:
    """K · η_l of one client, from the metrics that :meth:`fedsim.client.Client.fit` reports."""
    try:
        value = float(update.metrics["local_steps"]) * float(update.metrics["lr"])
    except KeyError as missing:
        raise ValueError(
            f"SCAFFOLD needs the metric {missing} in every update (fedsim.Client.fit reports local_steps and lr; "
            "a custom fit must report them too)"
        ) from None
    if not value > 0:
        raise ValueError(f"SCAFFOLD needs local_steps * lr > 0 (client {update.client_id} reported {value})")
    return value


class Scaffold(Strategy):
    """Server half. ``server_lr`` is η_g; ``state_store`` is ``"memory"`` or ``"disk"`` (``state_dir``).

    Option II assumes plain SGD on the clients (K steps of learning rate η_l); with momentum or an
    adaptive client optimizer the control update is only an approximation.
    """

    def __init__(self, *, server_lr: float = 1.0, state_store: str = "memory", state_dir: str | Path | None = None) -> None:
        if server_lr <= 0:
            raise ValueError(f"strategy.server_lr must be > 0 (got {server_lr})")
        self.server_lr = server_lr
        self.store: ClientStateStore = make_store(state_store, state_dir)
        self.control: torch.Tensor | None = None  # c, created on first use
        self.num_clients = 0

    def local_training(self) -> LocalTraining:
        return ControlCorrection()

    def sample(self, round_num: int, num_clients: int, clients_per_round: int, rng: np.random.Generator) -> list[int]:
        self.num_clients = num_clients  # N in the server's control update
        return super().sample(round_num, num_clients, clients_per_round, rng)

    def client_config(self, round_num: int, client_id: int) -> dict[str, Any]:
        if self.control is None:
            return {"scaffold_correction": np.zeros(0, dtype=np.float32)}
        client_control = self.store.get(client_id)
        correction = self.control if client_control is None else self.control - client_control
        return {"scaffold_correction": correction.numpy()}

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        control = self.control if self.control is not None else torch.zeros_like(global_params)
        control_deltas = torch.zeros_like(global_params, dtype=torch.float64)
        weight_deltas = torch.zeros_like(global_params, dtype=torch.float64)
        steps_times_lr = [_steps_times_lr(u) for u in updates]  # all checked before any state is written
        for update, k_lr in zip(updates, steps_times_lr):
            old = self.store.get(update.client_id)
            old = torch.zeros_like(global_params) if old is None else old
            new = old - control + (global_params - update.params) / k_lr
            self.store.put(update.client_id, new)
            control_deltas += (new - old).double()
            weight_deltas += (update.params - global_params).double()
        n = len(updates)
        self.control = (control.double() + control_deltas / max(self.num_clients, n)).float()
        return (global_params.double() + self.server_lr * weight_deltas / n).float()

    def state_dict(self) -> dict[str, Any]:
        """Server control variate c, N, and every client's control variate (from the store)."""
        control = None if self.control is None else self.control.clone()
        return {"control": control, "num_clients": self.num_clients, "client_states": self.store.snapshot()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.control, self.num_clients = state["control"], int(state["num_clients"])
        self.store.restore(state.get("client_states", {}))
