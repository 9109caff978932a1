"""Local differential privacy of each client's examples: DP-SGD in local training.

Abadi, Chu, Goodfellow, McMahan, Mironov, Talwar, Zhang. "Deep Learning with Differential Privacy." CCS 2016.

Each local step draws a Poisson batch (every training example of the client independently with probability q,
``sampling_rate``, from the task's generator), computes every example's gradient (``torch.func``: ``vmap`` of
``grad`` over the batch, the machinery ``executor=vmap`` uses), clips each to L2 norm ``clip_norm`` over all
trainable parameters, sums them, adds Gaussian noise N(0, (z·C)²) from a stream of its own (seeded from the task
seed) and divides by the expected batch size q·n; the optimizer then steps on that gradient (a strategy's
data-independent term, e.g. FedProx's, is added after, at no privacy cost). An epoch is ⌈1/q⌉ such steps, so
every client's steps are the same Poisson-sampled Gaussian mechanism whatever its size, and the accountant
(:class:`LocalLedger`) needs one RDP curve for the run.

Why ``torch.func`` rather than Opacus: fedsim already builds on it (vmap executor), it needs no model wrapping or
hooks (so any model fedsim can vmap works, and the result is bitwise the same under every executor), and the noise
comes from fedsim's task generator, which is what makes runs reproducible whatever the workers. Models with
BatchNorm are refused: per-example gradients are undefined with batch statistics (use GroupNorm).

``noise_multiplier=0`` is clip-only training, the standard ablation: every step is the same but its noise is
multiplied by 0 (the noise stream is still drawn, so the batches and every other draw stay as with noise), and the
ledger's ε is infinite after the first step (the library's own answer for a Gaussian of multiplier 0; 0 before any
step). The run says so in a warning; ``dp/local_epsilon_max`` is inf, which metrics.jsonl writes as null (as every
non-finite metric) and TensorBoard leaves out.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any, cast

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fedsim.client.base import Client
from fedsim.core.checks import number, within
from fedsim.core.params import checkpoints_activations
from fedsim.core.seeding import dpsgd_noise_seed
from fedsim.data.tensor_data import TensorData
from fedsim.privacy.accountant import accounting_library

log = logging.getLogger("fedsim")


class DPSGDClient(Client):
    """A :class:`~fedsim.client.base.Client` whose local steps are DP-SGD (see the module docstring); ``batch_size`` is
    unused (the expected batch is ``sampling_rate`` × the client's examples); ``delta`` is the δ at which the server
    reports each client's ε (:class:`LocalLedger`)."""

    def __init__(
        self,
        client_id: int,
        train_indices: Any,
        test_indices: Any = (),
        *,
        noise_multiplier: float = 1.0,
        clip_norm: float = 1.0,
        sampling_rate: float = 0.1,
        delta: float = 1e-5,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("local_steps") is not None:
            raise ValueError(
                "client.local_steps: client=dpsgd draws Poisson batches, an epoch being ⌈1/sampling_rate⌉ of them; "
                "set client.epochs instead"
            )
        super().__init__(client_id, train_indices, test_indices, **kwargs)
        if self.autocast is not None:
            raise ValueError(
                "client.autocast: DP-SGD's per-example gradients (torch.func) run outside Client.objective, so "
                "autocast would not apply; leave it null"
            )
        number("client.noise_multiplier", noise_multiplier, at_least=0, hint="; 0 is clip-only, ε = inf")
        number("client.clip_norm", clip_norm, above=0)
        within("client.sampling_rate", sampling_rate, "(0, 1]")
        within("client.delta", delta, "(0, 1)")
        self.noise_multiplier, self.clip_norm, self.sampling_rate, self.delta = (
            noise_multiplier,
            clip_norm,
            sampling_rate,
            delta,
        )
        self._noise: torch.Generator | None = None
        accounting_library()  # the server's LocalLedger needs it: without it, stop now in one line

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(round(1 / self.sampling_rate, 9))

    task_attributes = ("_noise",)  # the task's noise generator, set for the task only

    def _train(
        self,
        model: nn.Module,
        data: TensorData,
        config: dict[str, Any],
        generator: torch.Generator,
        round_num: int,
        local: Any,
    ) -> Any:
        """The local epochs, with the noise drawn from its own stream (:func:`fedsim.core.seeding.dpsgd_noise_seed` of
        the task seed), the batches from the task's generator."""
        self._noise = torch.Generator().manual_seed(dpsgd_noise_seed(generator.initial_seed()))
        update = super()._train(model, data, config, generator, round_num, local)
        epochs = int(config.get("epochs", self.epochs))
        return replace(update, metrics={**update.metrics, "local_steps": float(epochs * self.steps_per_epoch)})

    def _run_epoch(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        data: TensorData,
        batch_size: int,
        generator: torch.Generator,
        device: torch.device,
    ) -> float:
        """⌈1/q⌉ DP-SGD steps on Poisson batches; returns the mean loss of the examples drawn."""
        indices = torch.from_numpy(self.train_indices)
        total, seen = 0.0, 0
        for _ in range(self.steps_per_epoch):
            idx = indices[torch.rand(self.num_train, generator=generator) < self.sampling_rate].to(data.x.device)
            x, y = data.x[idx].to(device), data.y[idx].to(device)
            optimizer.zero_grad(set_to_none=True)
            loss_sum = self._private_gradient(model, x, y, cast(torch.Generator, self._noise))  # set by _train
            term = self._local.loss_term(model) if self._local is not None else None
            if term is not None:
                term.backward()
            optimizer.step()
            total += loss_sum
            seen += len(idx)
        return total / max(seen, 1)

    def _private_gradient(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, noise: torch.Generator) -> float:
        """Put the noisy mean of the clipped per-example gradients into ``.grad`` (the noise drawn from ``noise``,
        one ``randn`` per trainable parameter in order); returns the batch's loss sum."""
        trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
        fixed = {
            **{n: p.detach() for n, p in model.named_parameters() if not p.requires_grad},
            **dict(model.named_buffers()),
        }
        summed = {n: torch.zeros_like(p) for n, p in trainable.items()}
        loss_sum = 0.0
        if len(x):
            grads, losses = vmap(
                grad_and_value(self._example_loss(model, fixed)), in_dims=(None, 0, 0), randomness="different"
            )({n: p.detach() for n, p in trainable.items()}, x, y)
            norms = torch.sqrt(sum(g.reshape(len(x), -1).pow(2).sum(1) for g in grads.values()))
            factors = (self.clip_norm / norms.clamp_min(1e-12)).clamp(max=1.0)
            summed = {n: torch.einsum("b,b...->...", factors, g) for n, g in grads.items()}
            loss_sum = float(losses.double().sum())
        expected = self.sampling_rate * self.num_train
        for name, parameter in trainable.items():
            draw = torch.randn(parameter.shape, generator=noise).to(parameter.device)
            parameter.grad = (summed[name] + draw * (self.noise_multiplier * self.clip_norm)) / expected
        return loss_sum

    def _example_loss(self, model: nn.Module, fixed: dict[str, torch.Tensor]) -> Any:
        def loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            out = functional_call(model, {**params, **fixed}, (x.unsqueeze(0),))
            return self.per_example_loss(out, y.unsqueeze(0)).sum()

        return loss


class LocalLedger:
    """Each DP-SGD client's spent steps and its example-level ε (the server's view: every update a client returned
    counts, accepted or not). All clients share q and z, so ε is a function of a client's steps alone:
    :class:`~fedsim.privacy.accountant.PrivacyLedger`'s curve, composed that many times."""

    def __init__(self, sampling_rate: float, noise_multiplier: float, delta: float) -> None:
        from fedsim.privacy.accountant import PrivacyLedger

        self.curve = PrivacyLedger(sampling_rate, noise_multiplier, delta)
        self.steps: dict[int, int] = {}

    def record(self, updates: Any) -> dict[str, float]:
        """Add the steps of this round's ``updates``; the ``dp/`` metrics (ε of the client that has spent most)."""
        for update in updates:
            self.steps[update.client_id] = self.steps.get(update.client_id, 0) + int(
                update.metrics.get("local_steps", 0)
            )
        most = max(self.steps.values(), default=0)
        return {
            "dp/local_epsilon_max": self.curve.epsilon(most),
            "dp/local_steps_max": float(most),
            "dp/local_delta": self.curve.delta,
        }

    def epsilon(self, client_id: int) -> float:
        return self.curve.epsilon(self.steps.get(client_id, 0))

    def state_dict(self) -> dict[str, Any]:
        return {"steps": {str(c): s for c, s in self.steps.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = {int(c): int(s) for c, s in state["steps"].items()}


def local_ledger(clients: Any, model: nn.Module) -> LocalLedger | None:
    """The ledger of a run whose clients do DP-SGD (None otherwise); one line refuses mixed or unequal settings,
    BatchNorm models and gradient checkpointing."""
    private = [c for c in clients if isinstance(c, DPSGDClient)]
    if not private:
        return None
    settings = {(c.sampling_rate, c.noise_multiplier, c.delta) for c in private}
    if len(private) != len(clients) or len(settings) != 1:
        raise ValueError(
            "client: DP-SGD clients must be all the clients, with the same sampling_rate, noise_multiplier and delta"
        )
    norms = [type(m).__name__ for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if norms:
        raise ValueError(
            f"client=dpsgd: the model has {norms[0]}, whose batch statistics make per-example gradients "
            "undefined; use a model without BatchNorm (e.g. GroupNorm)"
        )
    if checkpoints_activations(model):
        raise ValueError(
            "client=dpsgd cannot use gradient checkpointing (its per-example gradients are torch.func transforms, "
            "which do not recompute activations); set model.gradient_checkpointing=false"
        )
    ((rate, z, delta),) = settings
    if z == 0:
        log.warning(
            "client.noise_multiplier=0: DP-SGD clips the per-example gradients but adds no noise; the examples have no "
            "privacy guarantee (ε = inf)"
        )
    return LocalLedger(rate, z, delta)
