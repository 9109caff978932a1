"""Training K clients in one vectorised pass: the local loop of :meth:`fedsim.client.base.Client.fit`, written with
``torch.func`` (``functional_call``, ``vmap``, ``grad_and_value``) over stacked per-client parameters.

Each client keeps its own batch order (drawn from its task's generator exactly as ``Client.fit`` draws it),
its own batch size, epoch count and hyper-parameters. Steps are aligned across the chunk: at step ``t``
every client that still has a ``t``-th batch trains on it; a batch shorter than the chunk's widest is
padded and its padding masked out of the loss, and a client that has done all its steps leaves the
vectorised calls (clients run longest first, so the ones left are always a prefix of the stack). The
result is the update each client would have produced alone, up to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fedsim.client.base import Client
from fedsim.client.local_training import LocalTraining, hook_before_step
from fedsim.core.params import ParamLayout, load_flat
from fedsim.core.state_values import copy_state
from fedsim.core.types import ClientUpdate
from fedsim.data.tensor_data import TensorData
from fedsim.executor.vmap import dpsgd, optim
from fedsim.executor.vmap.optim import OptimizerSpec, Tensors
from fedsim.executor.vmap.plan import ClientPlan

# When this few clients are left in a chunk, the rest of their steps run one client at a time with the
# eager model and torch.optim (a vectorised call costs ~0.7 ms for one client of a small model, an eager
# step ~0.1 ms: without this, one client with many more steps than the others makes a chunk slower
# than the serial executor).
EAGER_TAIL = 2

# One eager step's gradient into the model's ``.grad`` (model, x, y, the strategy's client half) → the loss to report.
EagerGradient = Callable[[nn.Module, torch.Tensor, torch.Tensor, "LocalTraining | None"], torch.Tensor]


@dataclass(frozen=True)
class ChunkModel:
    """What every chunk on one device shares: the model (for its forward), the layout and the data."""

    model: nn.Module
    layout: ParamLayout
    data: TensorData
    local: LocalTraining | None
    worker: str

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def train_chunk(ctx: ChunkModel, global_params: torch.Tensor, plans: Sequence[ClientPlan]) -> list[ClientUpdate]:
    """Train every planned client from ``global_params`` at once; one update per plan, in plan order."""
    order = sorted(range(len(plans)), key=lambda i: -plans[i].num_steps)  # longest first (stable)
    updates = _train_longest_first(ctx, global_params, [plans[i] for i in order])
    by_plan: list[ClientUpdate] = [updates[0]] * len(plans)
    for position, i in enumerate(order):
        by_plan[i] = updates[position]
    return by_plan


def _train_longest_first(
    ctx: ChunkModel, global_params: torch.Tensor, plans: Sequence[ClientPlan]
) -> list[ClientUpdate]:
    """The training loop. ``plans`` come longest first, so at step ``t`` the clients that still have steps
    left are exactly the first ``live[t]``: every call works on that prefix of the stacked tensors (views,
    updated in place) and no client computes steps it does not have."""
    device, k = ctx.device, len(plans)
    trainable, fixed = split_state(ctx, global_params)
    params = stack(trainable, k)
    spec = plans[0].optimizer
    hyper = optim.stack_hyper([p.optimizer for p in plans], device)
    decay = optim.any_decay([p.optimizer for p in plans])
    state = optim.init_state(spec, params)
    numbers = _stack_numbers(plans, device, ctx.layout, set(trainable))
    rows, mask = _step_tensors(plans, device)
    live = [sum(p.num_steps > t for p in plans) for t in range(rows.shape[0])]
    gradient = _gradient(ctx, fixed, trainable, plans)
    losses = torch.zeros(rows.shape[0], k, device=device)
    for t, n in enumerate(live):
        if n <= EAGER_TAIL:  # a vectorised call costs the same for one client as for many: finish one by one
            for i in range(n):
                _finish_eagerly(
                    ctx,
                    global_params,
                    plans[i],
                    t,
                    _client_view(params, i),
                    _client_state(spec, state, i),
                    losses[:, i],
                    gradient.eager_step(plans[i].client, i),
                )
            break
        grads, reported = gradient(t, _prefix(params, n), rows[t, :n], mask[t, :n], _prefix(numbers, n))
        optim.step(spec, _prefix(params, n), grads, _prefix(state, n), _prefix(hyper, n), first=t == 0, decay=decay)
        losses[t, :n] = reported.detach()
    flat = _flatten_stacked(ctx.layout, params, fixed, k)
    per_client = losses.double().cpu().T.tolist()
    return [_update(plan, flat[i], per_client[i], ctx) for i, plan in enumerate(plans)]


def _client_view(tensors: Tensors, i: int) -> Tensors:
    return {name: value[i] for name, value in tensors.items()}


def _client_state(
    spec: OptimizerSpec, state: Tensors, i: int
) -> Callable[[torch.optim.Optimizer, dict[str, nn.Parameter]], None]:
    return lambda optimizer, named: optim.to_torch_state(spec, optimizer, named, state, i)


def _finish_eagerly(
    ctx: ChunkModel,
    global_params: torch.Tensor,
    plan: ClientPlan,
    start: int,
    params: Tensors,
    give_state: Callable[[torch.optim.Optimizer, dict[str, nn.Parameter]], None],
    losses: torch.Tensor,
    gradient: EagerGradient,
) -> None:
    """Steps ``start`` onwards of one client with its own ``torch.optim`` optimizer on the device's model,
    as :meth:`Client.train_step` takes them (``gradient`` fills ``.grad``); ``params`` (views into the stack)
    receive the result."""
    model, client, config = ctx.model, plan.client, dict(plan.task.config)
    load_flat(model, global_params.to(ctx.device))
    if ctx.local is not None:
        ctx.local.begin_task(
            model, config, copy_state(plan.task.state)
        )  # anchored at the global model, as in Client.fit
    named = {name: p for name, p in model.named_parameters() if name in params}
    with torch.no_grad():
        for name, p in named.items():
            p.copy_(params[name])
    optimizer = client.make_optimizer(model, config)
    hook_before_step(ctx.local, model, optimizer)
    if start > 0:
        give_state(optimizer, named)
    model.train()
    for t in range(start, plan.num_steps):
        idx = plan.rows[t, : plan.sizes[t]].to(ctx.device)
        optimizer.zero_grad(set_to_none=True)
        losses[t] = gradient(model, ctx.data.x[idx], ctx.data.y[idx], ctx.local)
        optimizer.step()
    with torch.no_grad():
        for name, p in named.items():
            params[name].copy_(p)


class _BatchGradient:
    """The built-in loop's step: each live client's masked mean loss plus the strategy's functional term,
    differentiated per client; :meth:`eager_step` is the same step for one client on the eager model."""

    def __init__(self, ctx: ChunkModel, fixed: Tensors, anchor: Tensors, plans: Sequence[ClientPlan]) -> None:
        self.data = ctx.data
        self.grad_fn = vmap(
            grad_and_value(_objective(ctx, fixed, anchor, plans[0].client.per_example_loss), has_aux=True)
        )

    def __call__(
        self, t: int, params: Tensors, rows: torch.Tensor, mask: torch.Tensor, numbers: Tensors
    ) -> tuple[Tensors, torch.Tensor]:
        x, y = _gather(self.data.x, rows), _gather(self.data.y, rows)
        grads, (_, reported) = self.grad_fn(params, x, y, mask, numbers)
        return grads, reported

    @staticmethod
    def eager_step(client: Client, i: int) -> EagerGradient:
        def gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor, local: LocalTraining | None) -> torch.Tensor:
            objective = client.loss(model, x, y)
            term = local.loss_term(model) if local is not None else None
            objective = objective if term is None else objective + term
            objective.backward()
            return objective.detach()

        return gradient


def _gradient(
    ctx: ChunkModel, fixed: Tensors, anchor: Tensors, plans: Sequence[ClientPlan]
) -> _BatchGradient | dpsgd.PrivateGradient:
    """The chunk's step gradient: DP-SGD's (:mod:`fedsim.executor.vmap.dpsgd`) or the built-in loop's."""
    if dpsgd.is_private(plans[0].client):
        return dpsgd.PrivateGradient(ctx.model, fixed, anchor, ctx.local, plans, ctx.data, ctx.device)
    return _BatchGradient(ctx, fixed, anchor, plans)


def _gather(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``values[rows]`` for a 2-D ``rows`` (clients × batch); index_select is twice as fast as indexing here."""
    return values.index_select(0, rows.reshape(-1)).view(*rows.shape, *values.shape[1:])


def _prefix(tensors: dict[str, Any], n: int) -> dict[str, Any]:
    """The first ``n`` clients' entries (nested dicts too), as views (in-place updates reach the full tensors)."""
    return {name: _prefix(value, n) if isinstance(value, dict) else value[:n] for name, value in tensors.items()}


def stack(tensors: Tensors, k: int) -> Tensors:
    """``k`` copies of every tensor, stacked along a new leading client dimension (one client's values each)."""
    return {n: v.unsqueeze(0).repeat(k, *([1] * v.dim())) for n, v in tensors.items()}


def split_state(ctx: ChunkModel, global_params: torch.Tensor) -> tuple[Tensors, Tensors]:
    """The global weights as named tensors on the device: trained parameters (stacked per client by the
    caller), and the federated rest (frozen parameters and float buffers, shared by every client unchanged).

    What is not federated (non-float buffers; the frozen base of a ``federates_trainable_only`` model, LoRA's
    base with GPT-2's tied embedding and output weight) is not listed: ``functional_call`` leaves the model's
    own tensors there, once and unbatched, for every client of the chunk (and a tied weight stays tied)."""
    trainable_names = {n for n, p in ctx.model.named_parameters() if p.requires_grad}
    pieces = {n: v[0] for n, v in _split_flat(global_params.to(ctx.device).unsqueeze(0), ctx.layout).items()}
    trainable = {n: v for n, v in pieces.items() if n in trainable_names}
    fixed = {n: v for n, v in pieces.items() if n not in trainable_names}
    return trainable, fixed


def _objective(
    ctx: ChunkModel,
    fixed: Tensors,
    anchor: Tensors,
    per_example_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """One client's batch objective as a pure function of its parameters: the masked mean of the
    per-example loss, plus the strategy's functional client-side term (e.g. FedProx's); and, as the
    auxiliary output, the loss to report (the term only if it is a ``loss_term``, as in ``Client.fit``).

    With token labels (``y`` of shape ``[B, T]``, -100 where no loss is taken) each example weighs its number of
    scored tokens, so the mean is over the batch's scored tokens, as :meth:`Client.loss` takes it (the default
    per-example loss is each example's mean over its scored tokens)."""
    model, local = ctx.model, ctx.local
    reports_term = local is not None and type(local).loss_term is not LocalTraining.loss_term

    def objective(
        params: Tensors, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, numbers: Tensors
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = functional_call(model, {**fixed, **params}, (x,))
        weights = mask if y.ndim == 1 else mask * (y != -100).sum(dim=1)  # token labels: by scored tokens
        loss = (per_example_loss(logits, y) * weights).sum() / weights.sum().clamp(min=1)
        term = local.functional_term(params, anchor, numbers) if local is not None else None
        if term is None:
            return loss, loss.detach()
        total = loss + term
        return total, (total if reports_term else loss).detach()

    return objective


def _stack_numbers(
    plans: Sequence[ClientPlan], device: torch.device, layout: ParamLayout, trained: set[str]
) -> dict[str, Any]:
    """What functional terms read: numeric config entries present for every client as ``(K,)`` tensors,
    and model-sized vectors (as long as the flat weights) as ``{parameter name: (K, *shape)}``; vectors
    that are empty for every client (SCAFFOLD's first round) are left out."""
    shared = set.intersection(*(set(p.numbers) for p in plans))
    stacked: dict[str, Any] = {
        key: torch.tensor([p.numbers[key] for p in plans], dtype=torch.float32, device=device) for key in sorted(shared)
    }
    for key in sorted(set.intersection(*(set(p.vectors) for p in plans))):
        sizes = {int(p.vectors[key].size) for p in plans}
        if sizes == {0}:
            continue
        if sizes != {layout.numel}:
            raise ValueError(
                f"executor=vmap: config entry {key!r} has sizes {sorted(sizes)} in one round; a vector must "
                f"hold one value per weight ({layout.numel}) for every client, or be empty for every client"
            )
        flat = torch.from_numpy(np.stack([p.vectors[key] for p in plans]).astype(np.float32)).to(device)
        stacked[key] = {name: piece for name, piece in _split_flat(flat, layout).items() if name in trained}
    return stacked


def _split_flat(flat: torch.Tensor, layout: ParamLayout) -> Tensors:
    """``(K, numel)`` → ``{name: (K, *shape)}`` in the layout's (``state_dict``) order."""
    pieces, offset = {}, 0
    for name, shape in zip(layout.names, layout.shapes, strict=True):
        n = int(torch.Size(shape).numel())
        pieces[name] = flat[:, offset : offset + n].reshape(flat.shape[0], *shape)
        offset += n
    return pieces


def _step_tensors(plans: Sequence[ClientPlan], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``(T, K, B)`` and example mask ``(T, K, B)`` of every aligned step. Padding (a short batch's
    tail, or a step a client does not have) points at row 0 of the dataset, a real example, so the
    forward stays finite; the mask keeps it out of the loss."""
    steps = max(p.num_steps for p in plans)
    width = max((p.rows.shape[1] for p in plans if p.num_steps), default=1)
    rows = torch.zeros(steps, len(plans), width, dtype=torch.int64)
    mask = torch.zeros(steps, len(plans), width)
    for k, plan in enumerate(plans):
        if plan.num_steps:
            rows[: plan.num_steps, k, : plan.rows.shape[1]] = plan.rows
            mask[: plan.num_steps, k] = (torch.arange(width) < torch.tensor(plan.sizes).unsqueeze(1)).float()
    return rows.to(device), mask.to(device)


def _flatten_stacked(layout: ParamLayout, params: Tensors, fixed: Tensors, k: int) -> torch.Tensor:
    """``(K, numel)`` float32 CPU tensor: each client's float state in ``state_dict`` order."""
    pieces = [
        (params[n] if n in params else fixed[n].unsqueeze(0).expand(k, *fixed[n].shape)).reshape(k, -1)
        for n in layout.names
    ]
    return torch.cat(pieces, dim=1).detach().float().cpu() if pieces else torch.zeros(k, 0)


def _update(plan: ClientPlan, flat: torch.Tensor, per_step: list[float], ctx: ChunkModel) -> ClientUpdate:
    """The client's update, with the same metrics as :meth:`Client.fit` (example-weighted epoch losses)."""
    epoch_losses, sizes = [], plan.sizes
    for e in range(plan.epochs):
        steps = range(e * plan.steps_per_epoch, min((e + 1) * plan.steps_per_epoch, plan.num_steps))
        total = sum(per_step[t] * sizes[t] for t in steps)
        epoch_losses.append(total / max(sum(sizes[t] for t in steps), 1))
    return ClientUpdate(
        client_id=plan.task.client_id,
        round_num=plan.task.round_num,
        params=flat.clone(),
        num_examples=plan.client.num_train,
        metrics={
            "train_loss": sum(epoch_losses) / max(len(epoch_losses), 1),
            "local_steps": float(plan.num_steps),
            "lr": dict(plan.optimizer.hyper)["lr"],
        },
        epoch_losses=tuple(epoch_losses),
        worker=ctx.worker,
        device=str(ctx.device),
    )
