"""The client half of an algorithm: what a strategy changes in local training, called by the client.

It is defined here, on the client's side, because the client calls it: :class:`~fedsim.client.Client` and every
executor depend on this contract and never on a strategy; a strategy (:mod:`fedsim.strategy`) implements it and
returns an instance from :meth:`~fedsim.strategy.Strategy.local_training`. ``fedsim.strategy`` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.func import functional_call

from fedsim.core.types import ClientUpdate

if TYPE_CHECKING:
    from fedsim.client.task_trainer import TaskClient, TaskTrainer
    from fedsim.data.tensor_data import TensorData


@dataclass
class Batch:
    """One batch of the local epochs, as :meth:`LocalTraining.on_batch` sees it, before the client's step on it.

    ``model`` holds the weights before this batch's step; ``optimizer`` is the local epochs' (its ``lr`` is the
    round's, :attr:`lr`); ``state`` is the client's state for the task (the same dict :meth:`LocalTraining.begin_task`
    and :meth:`LocalTraining.end_task` receive: a personal model lives there); ``step`` counts the task's steps from
    0 across its local epochs."""

    x: torch.Tensor
    y: torch.Tensor
    model: nn.Module
    optimizer: torch.optim.Optimizer
    state: dict[str, Any]
    step: int
    client: TaskClient

    @property
    def lr(self) -> float:
        """The learning rate of the local step (the round's ``lr`` if the strategy sets one)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def loss(self, params: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """The client's training loss (:meth:`~fedsim.client.base.Client.loss`) of this batch, for :attr:`model`
        with the named parameters replaced by ``params`` (a second model that shares the architecture: autograd
        differentiates the result with respect to them) or, with ``None``, for the model as it is. Parameters and
        buffers not in ``params`` are the model's own; in training mode a BatchNorm layer's running statistics are
        updated, as on any forward pass."""
        if params is None:
            return self.client.loss(self.model, self.x, self.y)
        return cast(
            torch.Tensor, functional_call(_LossOf(self.client, self.model), _prefixed(params), (self.x, self.y))
        )


class _LossOf(nn.Module):
    """``client.loss(model, x, y)`` as a module, so that :func:`torch.func.functional_call` can swap the model's
    parameters for a second model's and still use the client's own loss."""

    def __init__(self, client: TaskClient, model: nn.Module) -> None:
        super().__init__()
        self.client, self.model = client, model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.client.loss(self.model, x, y)


def _prefixed(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"model.{name}": value for name, value in params.items()}


class LocalTraining:
    """The client half of an algorithm that changes local training (e.g. FedProx's proximal term).

    One instance is sent to every worker once per run (it must pickle) and is used there by
    :meth:`fedsim.client.base.Client.fit`: :meth:`begin` when a task starts (the model then holds the
    global weights), then for every batch either :meth:`loss_term` (added to the loss; autograd
    differentiates it) or :meth:`before_step` (adds a known gradient directly; cheaper). Per-round
    values (such as μ) come from the task's ``config``.
    """

    def begin(self, model: nn.Module, config: dict[str, Any]) -> None:
        """Called once per task, before the first step."""

    def begin_task(self, model: nn.Module, config: dict[str, Any], state: dict[str, Any]) -> None:
        """Called once per task, before the first step, with the client's state (see :mod:`fedsim.client.state`): a
        private copy that this client half may read (and change: what it holds at the end of the task becomes
        the client's new state if the server accepts the update). The default calls :meth:`begin`; override
        this instead when the client half reads per-client values kept across rounds. Under ``executor=vmap``
        :meth:`functional_term` with :meth:`vectorised_inputs` stands in for it."""
        self.begin(model, config)

    def end_task(self, model: nn.Module, config: dict[str, Any], state: dict[str, Any]) -> None:
        """Called once per task after the last step (``model`` holds the trained weights): write what the
        client keeps into ``state`` (e.g. FedPer's personal layers). ``executor=vmap`` has no model per
        client and refuses a client half that overrides this; prefer :meth:`update_state` where you can."""

    def before_training(self, trainer: TaskTrainer, state: dict[str, Any]) -> None:
        """Called once per task after :meth:`begin_task`, before the local epochs, with a
        :class:`~fedsim.client.task_trainer.TaskTrainer`: what this client half needs to train or measure beyond the
        standard local epochs (FedRep's head epochs, q-FFL's loss of the global model). Scalars it puts in
        ``trainer.metrics`` go into the update's metrics. ``executor=vmap`` refuses a client half that
        overrides it."""

    def after_training(self, trainer: TaskTrainer, state: dict[str, Any]) -> None:
        """Called once per task after the local epochs, once the update's weights are taken and before
        :meth:`end_task`: the model may be retrained freely here (Ditto's personal model). As
        :meth:`before_training`, refused by ``executor=vmap``."""

    def personalise(self, model: nn.Module, state: dict[str, Any]) -> bool:
        """For evaluation: put this client's personal parts, as ``state`` holds them, into ``model`` (which
        holds the global weights), and return True; return False when the client has none (it never trained:
        its personal model is the global one). Called by every executor for every client that is
        evaluated; overriding it is what makes an algorithm report ``eval_personal/`` metrics next to
        ``eval_global/`` (see docs/personalisation.md). The default has nothing personal."""
        return False

    def adapt(self, model: nn.Module, state: dict[str, Any], client: TaskClient, data: TensorData) -> bool:
        """For evaluation, as :meth:`personalise`, with the client and the training data at hand: an algorithm whose
        personal model is computed from the client's own examples when it is evaluated (Per-FedAvg's step of
        adaptation from the global model, :mod:`fedsim.strategy.perfedavg`) overrides this instead. It must be a
        pure function of the model, the state and the client's data (no random draw), as every executor calls it.
        The default is :meth:`personalise`."""
        return self.personalise(model, state)

    def check(self, model: nn.Module) -> None:
        """Refuse, with a one-line ``ValueError``, a model this client half cannot train (MOON needs a hidden
        representation); called once when the server is built, with the round-0 global model. The default accepts
        every model."""

    def update_state(
        self, state: dict[str, Any], config: dict[str, Any], global_params: torch.Tensor, update: ClientUpdate
    ) -> None:
        """After the task, on every executor (vmap included): change ``state`` from the task's ``config``, the
        global weights it started from and the ``update`` it produced (trained weights, ``local_steps``,
        ``lr``), e.g. SCAFFOLD's control variate. A pure function of those; the default does nothing."""

    def vectorised_inputs(self, config: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        """What :meth:`functional_term` receives as ``numbers`` under ``executor=vmap`` (numeric entries, and
        numpy arrays as long as the flat weights), from the task's config and the client's state. The
        default is the config itself; override it when the term depends on the client's state."""
        return config

    def loss_term(self, model: nn.Module) -> torch.Tensor | None:
        """An extra term for the batch loss, or ``None``. Its value is part of the reported training loss."""
        return None

    def before_step(self, model: nn.Module) -> None:
        """Called before every optimizer step, once the batch's gradients are in ``p.grad``: add a term's
        closed-form gradient to them in place (use :func:`gradients` to get them).

        For a term whose gradient is known this is much cheaper than :meth:`loss_term`, whose autograd
        graph is built and walked on every step (FedProx's proximal term on the MNIST 2NN: a step costs
        1.42× FedAvg's this way, 2.10× as a loss term; see docs/performance.md). The term's value is then
        not part of the reported training loss. It runs inside ``optimizer.step()`` (a step pre-hook), so
        an overridden :meth:`~fedsim.client.base.Client.train_step` gets it too; gradients an optimizer
        computes inside its own ``closure`` (L-BFGS) do not.
        """

    def on_batch(self, batch: Batch) -> float | torch.Tensor | None:
        """Called for every batch of the local epochs (not for :class:`~fedsim.client.task_trainer.TaskTrainer`'s
        extra epochs), before the client's step on it, with the batch, the model as it is before that step, the
        client's state and the step's index (see :class:`Batch`). Two uses:

        * return ``None`` and the client then takes its usual step: a second model (kept in ``batch.state``) steps
          beside the trained one on the same batch (APFL, :mod:`fedsim.strategy.apfl`);
        * take the step yourself (``batch.optimizer.step()`` after setting the gradients) and return the batch's
          loss to report: this replaces the client's step (pFedMe, :mod:`fedsim.strategy.pfedme`).

        :meth:`Batch.loss` gives the client's loss at a second model's parameters. The default does nothing (the
        client is then not even asked: results are those without the hook). ``executor=vmap`` refuses a client
        half that overrides it, and so does ``client=dpsgd`` (it has its own per-batch loop)."""
        return None

    def functional_term(
        self, params: dict[str, torch.Tensor], anchor: dict[str, torch.Tensor], numbers: dict[str, Any]
    ) -> torch.Tensor | None:
        """The term as a pure function, for ``executor=vmap`` (which calls it per client under
        ``torch.func.vmap`` instead of :meth:`begin`, :meth:`loss_term` and :meth:`before_step`): a term
        whose gradient is what :meth:`before_step` adds, or the value of :meth:`loss_term`. vmap reports
        its value in the training loss only when the class overrides :meth:`loss_term`, as ``Client.fit`` does.

        ``params``: the client's trained parameters by name; ``anchor``: the global weights the task
        started from; ``numbers``: the numeric entries of the task's config as 0-d tensors (e.g. μ), and
        its numpy-array entries as long as the flat weights (e.g. SCAFFOLD's correction) split into
        ``{parameter name: tensor shaped like the parameter}``; an array empty for every client is left out.
        The default says that this client half has no vectorised form, and ``executor=vmap`` refuses it
        at start-up; a client half that adds no term (the base class) needs none.
        """
        raise NotImplementedError(f"{type(self).__name__} has no functional_term(); executor=vmap cannot run it")


def personalises(local: LocalTraining | None) -> bool:
    """Whether ``local`` overrides :meth:`LocalTraining.personalise` or :meth:`LocalTraining.adapt` (the algorithm has
    personal models)."""
    return local is not None and (
        type(local).personalise is not LocalTraining.personalise or type(local).adapt is not LocalTraining.adapt
    )


class BatchSteps:
    """Calls a client half's :meth:`LocalTraining.on_batch` for every batch of one task's local epochs, numbering
    the steps, and takes the client's own step where the hook does not take one (it returns ``None``)."""

    def __init__(self, local: LocalTraining, state: dict[str, Any]) -> None:
        self.local, self.state, self.step = local, state, 0

    def run(
        self, client: TaskClient, model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
    ) -> float | torch.Tensor:
        """One batch: the hook, then the client's step unless the hook took it; returns the loss to report."""
        loss = self.local.on_batch(Batch(x, y, model, optimizer, self.state, self.step, client))
        self.step += 1
        return client.train_step(model, optimizer, x, y) if loss is None else loss


def overrides_on_batch(local: LocalTraining | None) -> bool:
    """Whether ``local`` overrides :meth:`LocalTraining.on_batch` (a per-batch algorithm such as APFL)."""
    return local is not None and type(local).on_batch is not LocalTraining.on_batch


def gradients(model: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The model's trained parameters and their ``.grad`` tensors, in the same order, for
    :meth:`LocalTraining.before_step`; a parameter that got no gradient this step gets a zero one."""
    params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return params, [cast(torch.Tensor, p.grad) for p in params]  # every one set above


def hook_before_step(local: LocalTraining | None, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Make ``optimizer.step()`` call ``local.before_step(model)`` first, if ``local`` overrides it."""
    if local is not None and type(local).before_step is not LocalTraining.before_step:
        optimizer.register_step_pre_hook(lambda _optimizer, _args, _kwargs: local.before_step(model))
