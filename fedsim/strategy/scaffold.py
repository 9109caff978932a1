"""SCAFFOLD: stochastic controlled averaging, with server and client control variates.

Karimireddy, Kale, Mohri, Reddi, Stich, Suresh. "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning." ICML 2020. Algorithm 1 with option II for the client control update:

    client i:  y ← x;  K steps of  y ← y − η_l (g_i(y) − c_i + c)
               c_i⁺ = c_i − c + (x − y) / (K η_l)
    server:    x ← x + η_g · mean_i (y_i − x);   c ← c + (|S| / N) · mean_i (c_i⁺ − c_i)

Both halves live here. The client's c_i is its client state (``state["scaffold_control"]``, a flat tensor;
see :mod:`fedsim.client.state`): the server ships it with the task, and c_i⁺ comes back with the update and is
committed only if the update is accepted. c travels in the task's config. The correction c − c_i is added to
every step's gradients before the optimizer step (under ``executor=vmap``: as the linear term ⟨c − c_i, y⟩,
whose gradient it is). Since c_i⁺ − c_i = (x − y_i) / (K η_l) − c, the server updates c from the returned
weights alone, never reading a client's state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsim.core.checks import number
from fedsim.core.params import ParamLayout
from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import LocalTraining, Strategy, gradients
from fedsim.strategy.context import RunContext

STATE_KEY = "scaffold_control"  # c_i, in the client's state
CONFIG_KEY = "scaffold_control"  # c, in the task's config (an empty array while c = 0)


def _tensor(array: Any) -> torch.Tensor | None:
    """A config or state entry as a flat float32 tensor; ``None`` when it is absent or empty (meaning 0)."""
    if array is None:
        return None
    value = torch.as_tensor(np.asarray(array, dtype=np.float32)) if not isinstance(array, torch.Tensor) else array
    return value if value.numel() else None


def correction(config: dict[str, Any], state: dict[str, Any]) -> torch.Tensor | None:
    """c − c_i as a flat tensor, or ``None`` while both are 0 (a client's first round before c moved)."""
    control, own = _tensor(config.get(CONFIG_KEY)), _tensor(state.get(STATE_KEY))
    if control is None and own is None:
        return None
    if control is None:
        assert own is not None  # both None returned above
        return -own
    return control if own is None else control - own


class ControlCorrection(LocalTraining):
    """Client half: adds c − c_i to every step's gradients (the gradient of the linear term ⟨c − c_i, w⟩),
    and replaces c_i by c_i⁺ after the task."""

    def __init__(self) -> None:
        self.pieces: list[tuple[nn.Parameter, torch.Tensor]] = []

    def begin_task(self, model: nn.Module, config: dict[str, Any], state: dict[str, Any]) -> None:
        flat = correction(config, state)
        self.pieces = []
        if flat is None:
            return
        device = next(model.parameters()).device
        where = ParamLayout.of(model).slices()  # the federated entries' places in the flat vector
        for name, param in model.named_parameters():
            if not param.requires_grad:  # frozen: no gradient to correct (and not in gradients(model))
                continue
            self.pieces.append((param, flat[where[name]].view(param.shape).to(device)))

    def before_step(self, model: nn.Module) -> None:
        if not self.pieces:
            return
        _, grads = gradients(model)
        with torch.no_grad():
            torch._foreach_add_(grads, [piece for _, piece in self.pieces])

    def update_state(
        self, state: dict[str, Any], config: dict[str, Any], global_params: torch.Tensor, update: ClientUpdate
    ) -> None:
        """c_i⁺ = c_i − c + (x − y) / (K η_l) (option II)."""
        own, control = _tensor(state.get(STATE_KEY)), _tensor(config.get(CONFIG_KEY))
        new = (global_params - update.params) / steps_times_lr(update)
        if control is not None:
            new = new - control
        state[STATE_KEY] = new if own is None else own + new

    def vectorised_inputs(self, config: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        flat = correction(config, state)
        return {"scaffold_correction": np.zeros(0, dtype=np.float32) if flat is None else flat.numpy()}

    def functional_term(
        self, params: dict[str, torch.Tensor], anchor: dict[str, torch.Tensor], numbers: dict[str, Any]
    ) -> torch.Tensor | None:
        """The same term for ``executor=vmap``, which hands the correction over already split by parameter."""
        split = numbers.get("scaffold_correction")
        if split is None:  # c = c_i = 0 for every client of the chunk
            return None
        return sum((param * split[name]).sum() for name, param in params.items())


def steps_times_lr(update: ClientUpdate) -> float:
    """K · η_l of one client, from the metrics that :meth:`fedsim.client.base.Client.fit` reports."""
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
    """Server half. ``server_lr`` is η_g. Option II assumes plain SGD on the clients (K steps of learning rate
    η_l); with momentum or an adaptive client optimizer the control update is only an approximation."""

    def __init__(self, *, server_lr: float = 1.0) -> None:
        number("strategy.server_lr", server_lr, above=0)
        self.server_lr = server_lr
        self.control: torch.Tensor | None = None  # c, created on first use
        self.num_clients = 0  # N, from setup()

    def setup(self, context: RunContext) -> None:
        self.num_clients = context.num_clients

    def local_training(self) -> LocalTraining:
        return ControlCorrection()

    def client_config(self, round_num: int, client_id: int) -> dict[str, Any]:
        control = np.zeros(0, dtype=np.float32) if self.control is None else self.control.numpy()
        return {CONFIG_KEY: control}  # one array shared by every task of the round

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        control = self.control if self.control is not None else torch.zeros_like(global_params)
        control_deltas = torch.zeros_like(global_params, dtype=torch.float64)
        weight_deltas = torch.zeros_like(global_params, dtype=torch.float64)
        for update in updates:  # c_i⁺ − c_i = (x − y_i) / (K η_l) − c, as the client computed it
            control_deltas += ((global_params - update.params) / steps_times_lr(update) - control).double()
            weight_deltas += (update.params - global_params).double()
        n = len(updates)
        self.control = (control.double() + control_deltas / max(self.num_clients, n)).float()
        return (global_params.double() + self.server_lr * weight_deltas / n).float()

    def state_dict(self) -> dict[str, Any]:
        """Server control variate c (the clients' c_i live in their client states)."""
        return {"control": None if self.control is None else self.control.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.control = state["control"]
