"""MOON: model-contrastive federated learning.

Li, He, Song. "Model-Contrastive Federated Learning." CVPR 2021, Equations (3)-(4) and Algorithm 1. On every batch
(x, y) of its local steps, client i minimises

    ℓ = ℓ_sup(w; x, y) + μ ℓ_con,
    ℓ_con = −log [ exp(sim(z, z_glob)/τ) / (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) ]   (mean over the batch)

where z, z_glob and z_prev are the representations of x by the model being trained (w), the round's global model
w^t (the positive pair) and the client's previous local model w_i^{t−1} (the negative pair), sim is the cosine
similarity and τ the temperature. ℓ_sup is the client's own loss; the step is the client's optimizer's on ℓ.

    server:  w^{t+1} = Σ_k (n_k / n) w_k        (FedAvg)

**The representation** is the input of the model's last ``nn.Linear`` layer (in module order: the classifier of
every bundled model, ``lm_head`` of a language model), flattened per example: the output of the penultimate layer,
which in the paper's networks is the projection head's. A forward pre-hook captures it, so a model needs no method
of its own; a model without a Linear layer, or whose last Linear reads the input itself (a logistic regression:
nothing learnt precedes it), is refused in one line when the server is built. z_glob and z_prev are computed without
gradient and in evaluation mode (no dropout, BatchNorm's running statistics untouched), as the original code runs
the previous model; the buffers are the trained model's.

**The previous local model** is the client's state (``state["moon_previous"]``: its trained parameters by name after
its last round, committed only for accepted updates and checkpointed). With partial participation it dates from the
client's last participation. A client's first round has no previous model and so no negative pair: ℓ_con = 0, as in
the original code's first round (with z_prev = z_glob it would be the constant log 2: the same gradient). The
batch's reported loss is ℓ; ``fit/moon_contrastive`` is the example-weighted mean of ℓ_con over the task's batches.
Defaults μ = 1 and τ = 0.5 are the paper's (μ is tuned per dataset there: 5 for CIFAR-10, 1 for CIFAR-100 and
Tiny-ImageNet). ``executor=vmap`` refuses MOON (per-batch forwards of two more models).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from fedsim.client.local_training import Batch
from fedsim.client.task_trainer import TaskTrainer
from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import LocalTraining, Strategy
from fedsim.strategy.functional import weighted_average

PREVIOUS_KEY = "moon_previous"  # w_i^{t-1}: {parameter name: tensor}, in the client's state


def representation_layer(model: nn.Module) -> nn.Linear:
    """The last ``nn.Linear`` of ``model``, whose input is MOON's representation; a one-line ``ValueError`` when there
    is none or nothing trained comes before it."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    name = type(model).__name__
    if not linears:
        raise ValueError(
            f"strategy=moon contrasts the input of the model's last nn.Linear layer, and {name} has none; use a model "
            "with a Linear classifier (e.g. model=mlp or model=cnn)"
        )
    first = next((m for m in model.modules() if any(p.requires_grad for p in m.parameters(recurse=False))), None)
    if first is linears[-1]:
        raise ValueError(
            f"strategy=moon contrasts the input of the model's last nn.Linear layer, and {name}'s reads the data "
            "itself (no trained layer before it: nothing to contrast); use a model with a hidden layer (e.g. model=mlp)"
        )
    return linears[-1]


@contextlib.contextmanager
def captured(layer: nn.Module) -> Iterator[list[torch.Tensor]]:
    """The inputs of ``layer``'s forward calls while the block runs (the last one is the representation)."""
    seen: list[torch.Tensor] = []
    handle = layer.register_forward_pre_hook(lambda _module, args: seen.append(args[0]))
    try:
        yield seen
    finally:
        handle.remove()


def contrastive_loss(
    z: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor | None, tau: float
) -> torch.Tensor:
    """ℓ_con of a batch of representations ``[B, d]``: −log of the positive pair's softmax share, mean over the batch;
    0 without a negative pair."""
    if negative is None:
        return torch.zeros((), dtype=z.dtype, device=z.device)
    logits = torch.stack(
        [nn.functional.cosine_similarity(z, positive, dim=1), nn.functional.cosine_similarity(z, negative, dim=1)], 1
    )
    return nn.functional.cross_entropy(logits / tau, torch.zeros(len(z), dtype=torch.long, device=z.device))


class ModelContrast(LocalTraining):
    """Client half: ℓ_sup + μ ℓ_con on every batch, against the round's global model and the previous local model."""

    def __init__(self, mu: float, temperature: float) -> None:
        self.mu, self.temperature = mu, temperature
        self.anchors: list[dict[str, torch.Tensor]] = []  # the global model, then the previous one if there is one
        self.term: tuple[float | torch.Tensor, int] = (0.0, 0)  # Σ ℓ_con · batch size, examples: this task's

    def check(self, model: nn.Module) -> None:
        representation_layer(model)

    def begin_task(self, model: nn.Module, config: dict[str, Any], state: dict[str, Any]) -> None:
        trained = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        self.anchors = [trained]
        if PREVIOUS_KEY in state:
            self.anchors.append({n: state[PREVIOUS_KEY][n].to(p.device) for n, p in trained.items()})
        self.term = (0.0, 0)

    def on_batch(self, batch: Batch) -> torch.Tensor:
        layer = representation_layer(batch.model)
        with captured(layer) as seen:
            supervised = batch.loss()
        z = seen[-1].flatten(1)
        anchors = [self._represent(batch.model, layer, params, batch.x) for params in self.anchors]
        term = contrastive_loss(z, anchors[0], anchors[1] if len(anchors) > 1 else None, self.temperature)
        loss = supervised + self.mu * term
        batch.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        batch.optimizer.step()
        total, seen_examples = self.term
        self.term = (total + term.detach().double() * len(batch.x), seen_examples + len(batch.x))  # no GPU wait
        return loss.detach()

    @staticmethod
    @torch.no_grad()
    def _represent(
        model: nn.Module, layer: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor
    ) -> torch.Tensor:
        """The representation of ``x`` by ``model`` with ``params``, in evaluation mode."""
        was_training = model.training
        model.eval()
        try:
            with captured(layer) as seen:
                functional_call(model, params, (x,))
        finally:
            model.train(was_training)
        return seen[-1].flatten(1)

    def after_training(self, trainer: TaskTrainer, state: dict[str, Any]) -> None:
        total, examples = self.term
        trainer.metrics["moon_contrastive"] = float(total) / max(examples, 1)  # logged as fit/moon_contrastive

    def end_task(self, model: nn.Module, config: dict[str, Any], state: dict[str, Any]) -> None:
        state[PREVIOUS_KEY] = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


class MOON(Strategy):
    """FedAvg of clients trained with MOON's model-contrastive term (client half)."""

    keeps_stragglers = False  # the global model is FedAvg's

    def __init__(self, *, mu: float = 1.0, temperature: float = 0.5) -> None:
        if not mu >= 0:
            raise ValueError(f"strategy.mu must be >= 0 (got {mu}): the weight of the contrastive term (0: FedAvg)")
        if not temperature > 0:
            raise ValueError(f"strategy.temperature must be > 0 (got {temperature}): τ of the contrastive term")
        self.mu, self.temperature = float(mu), float(temperature)

    def local_training(self) -> LocalTraining:
        return ModelContrast(self.mu, self.temperature)

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        return weighted_average([u.params for u in updates], [u.num_examples for u in updates])
