"""FedDyn: federated learning with dynamic regularisation, so that the clients' local optima agree with the global one.

Acar, Zhao, Matas, Mattina, Whatmough, Saligrama. "Federated Learning Based on Dynamic Regularization."
ICLR 2021. Algorithm 1, with m clients in the federation and P_t those that report in round t:

    client k:  θ_k^t = argmin_θ  L_k(θ) − ⟨g_k, θ⟩ + (α/2) ‖θ − θ^{t−1}‖²        g_k = ∇L_k(θ_k^{t−1}), 0 at first
               g_k ← g_k − α (θ_k^t − θ^{t−1})
    server:    h   ← h − α · (1/m) · Σ_{k∈P_t} (θ_k^t − θ^{t−1})                   h = 0 at first
               θ^t = (1/|P_t|) · Σ_{k∈P_t} θ_k^t − (1/α) · h

As in the paper, the server averages the participating clients uniformly, not by example counts n_k. Both
halves live here. g_k is the client's state (``state["feddyn_linear"]``, a flat tensor; see
:mod:`fedsim.client.state`), changed by :meth:`DynamicRegulariser.update_state` from the weights the task returned,
so it works under every executor. The minimisation is the client's local epochs: the term's gradient
−g_k + α (θ − θ^{t−1}) is added to every step's gradients (under ``executor=vmap``: the term itself); the
state update is the first-order condition of an exact minimiser, so with a few SGD epochs, momentum or an
adaptive optimiser it is the approximation the paper's experiments make too. h is the server's state and
goes into checkpoints. Float buffers (BatchNorm's running statistics) are not trained: h leaves them out,
and they are plainly averaged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fedsim.core.checks import number
from fedsim.core.params import ParamLayout
from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import LocalTraining, Strategy, gradients
from fedsim.strategy.context import RunContext

STATE_KEY = "feddyn_linear"  # g_k, in the client's state
ALPHA_KEY = "feddyn_alpha"  # α, in the task's config
SIZE_KEY = "feddyn_size"  # in the task's config: the flat size once a client may hold g_k (else 0), for vmap


def _flat(state: dict[str, Any]) -> torch.Tensor | None:
    """g_k as a flat float32 tensor, or ``None`` while the client has none (g_k = 0)."""
    value = state.get(STATE_KEY)
    return None if value is None else torch.as_tensor(value, dtype=torch.float32)


def _trained_pieces(model: nn.Module, flat: torch.Tensor) -> list[torch.Tensor]:
    """``flat`` (in the flat vector's order, :class:`~fedsim.core.params.ParamLayout`) cut into the model's trained
    parameters' shapes, in the order of :func:`gradients`."""
    where = ParamLayout.of(model).slices()  # the federated entries' places (a LoRA model's: its adapters only)
    device = next(model.parameters()).device
    return [flat[where[name]].view(p.shape).to(device) for name, p in model.named_parameters() if p.requires_grad]


class DynamicRegulariser(LocalTraining):
    """Client half: adds −g_k + α (θ − θ^{t−1}) to every step's gradients, the gradient of the term
    −⟨g_k, θ⟩ + (α/2) ‖θ − θ^{t−1}‖² (so the reported training loss is the data loss alone), and updates g_k
    after the task."""

    def __init__(self) -> None:
        self.alpha = 0.0
        self.anchor: list[torch.Tensor] = []  # θ^{t−1}, trained parameters only
        self.linear: list[torch.Tensor] = []  # g_k in the same pieces; empty while g_k = 0

    def begin_task(self, model: nn.Module, config: dict[str, Any], state: dict[str, Any]) -> None:
        self.alpha = float(config[ALPHA_KEY])
        self.anchor = [p.detach().clone() for p in model.parameters() if p.requires_grad]
        flat = _flat(state)
        self.linear = [] if flat is None else _trained_pieces(model, flat)

    def before_step(self, model: nn.Module) -> None:
        params, grads = gradients(model)
        with torch.no_grad():
            torch._foreach_add_(grads, torch._foreach_sub(params, self.anchor), alpha=self.alpha)
            if self.linear:
                torch._foreach_sub_(grads, self.linear)

    def update_state(
        self, state: dict[str, Any], config: dict[str, Any], global_params: torch.Tensor, update: ClientUpdate
    ) -> None:
        """g_k ← g_k − α (θ_k^t − θ^{t−1})."""
        step = float(config[ALPHA_KEY]) * (update.params - global_params)
        own = _flat(state)
        state[STATE_KEY] = -step if own is None else own - step

    def vectorised_inputs(self, config: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        """α, and g_k as an array: empty in the first round (no client holds one), else flat-sized for every
        client (zeros for a client that has none yet), as vmap stacks one array per client."""
        flat = _flat(state)
        if flat is None:
            flat = torch.zeros(int(config.get(SIZE_KEY, 0)))
        return {ALPHA_KEY: config[ALPHA_KEY], STATE_KEY: flat.numpy()}

    def functional_term(
        self, params: dict[str, torch.Tensor], anchor: dict[str, torch.Tensor], numbers: dict[str, Any]
    ) -> torch.Tensor | None:
        """−⟨g_k, θ⟩ + (α/2) ‖θ − θ^{t−1}‖² for ``executor=vmap``, with g_k split by parameter (absent: 0); no
        term without α (vmap's start-up probe trains a task without config)."""
        if ALPHA_KEY not in numbers:
            return None
        squared = sum(((p - anchor[name]) ** 2).sum() for name, p in params.items())
        term = 0.5 * numbers[ALPHA_KEY] * squared
        linear = numbers.get(STATE_KEY)
        if linear is None:
            return term
        return term - sum((p * linear[name]).sum() for name, p in params.items())


class FedDyn(Strategy):
    """Server half: keeps h and returns the uniform mean of the participants' weights minus h / α. Keeps
    stragglers: fewer local steps are a less exact local minimisation, and no client's is exact (the paper's
    analysis assumes exact ones)."""

    keeps_stragglers = True

    def __init__(self, *, alpha: float = 0.01) -> None:
        number("strategy.alpha", alpha, above=0)
        self.alpha = alpha
        self.h: torch.Tensor | None = None  # created by the first aggregate
        self.num_clients = 0  # m, from setup()
        self.size = 0  # the flat weights' length, from setup()
        self.trained: torch.Tensor | None = None  # 1.0 on parameters, 0.0 on float buffers; None: no buffers

    def setup(self, context: RunContext) -> None:
        self.num_clients = context.num_clients
        self.size = context.layout.numel
        buffers = context.layout.mask(context.layout.buffers)
        self.trained = (~buffers).double() if bool(buffers.any()) else None

    def local_training(self) -> LocalTraining:
        return DynamicRegulariser()

    def client_config(self, round_num: int, client_id: int) -> dict[str, Any]:
        return {ALPHA_KEY: self.alpha, SIZE_KEY: 0 if self.h is None else self.size}

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        start = global_params.double()
        deltas = torch.zeros_like(start)
        for update in updates:  # Σ_{k∈P_t} (θ_k^t − θ^{t−1}), in client-id order
            deltas += update.params.double() - start
        n, m = len(updates), max(self.num_clients, len(updates))
        correction = deltas if self.trained is None else deltas * self.trained
        h = (torch.zeros_like(start) if self.h is None else self.h.double()) - (self.alpha / m) * correction
        self.h = h.float()
        return (start + deltas / n - h / self.alpha).to(global_params.dtype)

    def state_dict(self) -> dict[str, Any]:
        """h (the clients' g_k live in their client states)."""
        return {"h": None if self.h is None else self.h.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.h = state["h"]
