"""Per-FedAvg: FedAvg of a MAML objective, personalised by one step of adaptation from the global model.

Fallah, Mokhtari, Ozdaglar. "Personalized Federated Learning with Theoretical Guarantees: A Model-Agnostic
Meta-Learning Approach." NeurIPS 2020, Algorithm 1 and its first-order (FO) and Hessian-free (HF) variants
(Section 5). Each client minimises F_i(w) = f_i(w − α ∇f_i(w)); one local step of client i, from w, on consecutive
batches D, D' (and D'' for HF) of its local loop:

    w̃ = w − α ∇f_i(w; D)                                            (the inner step α, on batch D: no step of w)
    FO:  w ← w − β ∇f_i(w̃; D')                                       (on batch D')
    HF:  w ← w − β [∇f_i(w̃; D') − α d],                              (on batch D'')
         d = [∇f_i(w + δ g; D'') − ∇f_i(w − δ g; D'')] / (2δ),  g = ∇f_i(w̃; D')

d is the finite-difference estimate of the Hessian-vector product ∇²f_i(w; D'') g. So a step takes two batches
(FO) or three (HF) of the client's local loop: K local batches (``client.local_steps``, or its epochs' batches,
counted across epochs) make ⌊K/2⌋ or ⌊K/3⌋ steps of w, and a trailing batch that cannot complete one trains
nothing. The outer step is the client optimizer's step on the meta-gradient (with plain SGD exactly the rule above);
its rate β is ``strategy.beta``, sent as the round's ``lr`` (null: the client's own learning rate, e.g.
``client.optimizer.lr``). The inner steps are plain gradient steps of size α. The reported loss of a batch is the
loss where its gradient is taken: f_i(w; D), f_i(w̃; D') and, for HF's D'', the mean of f_i(w ± δ g; D'').

    server:  w^{t+1} = Σ_k (n_k / n) w_k        (FedAvg; the paper's uniform mean when the sizes are equal)

Personalisation at evaluation (``eval_personal/``, :meth:`MetaStep.adapt`): every evaluated client's personal
model is one step of adaptation from the current global model, θ_i = w − α ∇f_i(w; D_i), where D_i is all of the
client's training examples (a full-batch gradient in evaluation mode: no random draw, so every executor computes
the same θ_i). No client state is kept. Buffers (BatchNorm statistics) are the model's own, updated by every
forward in training mode. ``executor=vmap`` refuses Per-FedAvg (per-batch steps), as do ``client=dpsgd`` and a
client with its own epoch loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fedsim.client.local_training import Batch
from fedsim.client.task_trainer import TaskClient
from fedsim.core.types import ClientUpdate
from fedsim.data.tensor_data import TensorData
from fedsim.strategy.base import LocalTraining, Strategy
from fedsim.strategy.functional import weighted_average

Tensors = dict[str, torch.Tensor]
VARIANTS = ("fo", "hf")
ADAPT_CHUNK = 1024  # training rows per forward pass of the evaluation's full-batch gradient


def gradient_at(batch: Batch, params: Tensors) -> tuple[torch.Tensor, Tensors]:
    """The client's loss on ``batch`` at ``params`` (the trained parameters by name) and its gradient there; a
    parameter the loss does not reach gets a zero gradient."""
    leaves = {n: t.detach().requires_grad_() for n, t in params.items()}
    loss = batch.loss(leaves)
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    return loss.detach(), {
        n: torch.zeros_like(t) if g is None else g for (n, t), g in zip(leaves.items(), grads, strict=True)
    }


class MetaStep(LocalTraining):
    """Client half: on every two (FO) or three (HF) batches one Per-FedAvg step of w; one step of adaptation
    (α) from the global model at evaluation."""

    def __init__(self, alpha: float, variant: str, delta: float) -> None:
        self.alpha, self.variant, self.delta = alpha, variant, delta
        self.adapted: Tensors = {}  # w̃ of the step in progress
        self.outer: Tensors = {}  # ∇f(w̃; D') of the step in progress (HF)

    def begin_task(self, model: nn.Module, config: dict[str, Any], state: dict[str, Any]) -> None:
        self.adapted, self.outer = {}, {}

    def on_batch(self, batch: Batch) -> torch.Tensor:
        trained = {n: p for n, p in batch.model.named_parameters() if p.requires_grad}
        w = {n: p.detach() for n, p in trained.items()}
        phase = batch.step % (2 if self.variant == "fo" else 3)
        if phase == 0:  # D: the inner step
            loss, g = gradient_at(batch, w)
            self.adapted = {n: w[n] - self.alpha * g[n] for n in w}
            return loss
        if phase == 1:  # D': the gradient at w̃
            loss, self.outer = gradient_at(batch, self.adapted)
            if self.variant == "fo":
                _step(batch, trained, self.outer)
            return loss
        g, d = self.outer, self.delta  # D'': the Hessian-vector product by finite differences
        plus_loss, plus = gradient_at(batch, {n: w[n] + d * g[n] for n in w})
        minus_loss, minus = gradient_at(batch, {n: w[n] - d * g[n] for n in w})
        _step(batch, trained, {n: g[n] - self.alpha * (plus[n] - minus[n]) / (2 * d) for n in w})
        return (plus_loss + minus_loss) / 2

    def adapt(self, model: nn.Module, state: dict[str, Any], client: TaskClient, data: TensorData) -> bool:
        """θ_i = w − α ∇f_i(w; D_i) over all of the client's training examples, in evaluation mode; False (the global
        model) for a client without training examples."""
        rows = torch.from_numpy(client.train_indices)
        if not rows.numel():
            return False
        trained = [p for p in model.parameters() if p.requires_grad]
        device = trained[0].device
        was_training = model.training
        model.eval()
        try:
            grads = [torch.zeros_like(p) for p in trained]
            with torch.enable_grad():
                for start in range(0, rows.numel(), ADAPT_CHUNK):
                    idx = rows[start : start + ADAPT_CHUNK].to(data.x.device)
                    loss = client.loss(model, data.x[idx].to(device), data.y[idx].to(device))
                    parts = torch.autograd.grad(loss * (len(idx) / rows.numel()), trained, allow_unused=True)
                    grads = [a if b is None else a + b for a, b in zip(grads, parts, strict=True)]
        finally:
            model.train(was_training)
        with torch.no_grad():
            for p, g in zip(trained, grads, strict=True):
                p.sub_(self.alpha * g)
        return True


def _step(batch: Batch, trained: dict[str, nn.Parameter], grads: Tensors) -> None:
    """The outer step: the client's optimizer on ``grads`` (rate β: the round's ``lr``)."""
    for name, p in trained.items():
        p.grad = grads[name]
    batch.optimizer.step()


class PerFedAvg(Strategy):
    """FedAvg of the clients' Per-FedAvg steps (client half); evaluation personalises by one step α."""

    keeps_stragglers = False  # the global model is FedAvg's

    def __init__(
        self, *, alpha: float = 0.01, beta: float | None = None, variant: str = "fo", delta: float = 0.001
    ) -> None:
        if not alpha > 0:
            raise ValueError(f"strategy.alpha must be > 0 (got {alpha}): the inner step of Per-FedAvg")
        if beta is not None and not beta > 0:
            raise ValueError(f"strategy.beta must be > 0 or null (got {beta}); null: the client's learning rate")
        if variant not in VARIANTS:
            raise ValueError(f"strategy.variant must be fo or hf (got {variant!r}): first-order or Hessian-free")
        if not delta > 0:
            raise ValueError(f"strategy.delta must be > 0 (got {delta}): HF's finite-difference step")
        self.alpha, self.beta, self.variant, self.delta = float(alpha), beta, variant, float(delta)

    def local_training(self) -> LocalTraining:
        return MetaStep(self.alpha, self.variant, self.delta)

    def client_config(self, round_num: int, client_id: int) -> dict[str, Any]:
        """β as the round's ``lr`` (the client's own rate when ``beta`` is null)."""
        return {} if self.beta is None else {"lr": float(self.beta)}

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        return weighted_average([u.params for u in updates], [u.num_examples for u in updates])
