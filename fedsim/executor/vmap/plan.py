"""A task of ``executor=vmap``, unrolled before training (:class:`ClientPlan`): every local step's dataset rows,
drawn from the task's generator exactly as :meth:`fedsim.client.base.Client.fit` (or DP-SGD's Poisson sampling)
draws them, and the client's optimizer; :mod:`fedsim.executor.vmap.train` then trains a chunk of plans at once."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedsim.client.base import Client
from fedsim.client.local_training import LocalTraining
from fedsim.core.types import FitTask
from fedsim.executor.vmap import dpsgd, optim
from fedsim.executor.vmap.optim import OptimizerSpec


@dataclass(frozen=True)
class ClientPlan:
    """One task, unrolled: the dataset rows of every local step, in order (``rows[t, :sizes[t]]``; the
    rest of a short last batch is padding), and how the client optimises."""

    task: FitTask
    client: Client
    rows: torch.Tensor  # (steps, batch size), int64
    sizes: tuple[int, ...]  # examples in each step
    epochs: int
    steps_per_epoch: int
    optimizer: OptimizerSpec
    numbers: dict[str, float]  # the numeric entries of the task's config (e.g. FedProx's prox_mu)
    vectors: dict[str, np.ndarray]  # its numpy-array entries (e.g. SCAFFOLD's correction)

    @property
    def num_steps(self) -> int:
        return len(self.sizes)


def plan_task(
    client: Client, task: FitTask, model: nn.Module, spec_cache: dict | None = None, local: LocalTraining | None = None
) -> ClientPlan:
    """Draw the task's batch order from its generator exactly as :meth:`Client.fit` does (its epochs, or its
    ``local_steps``: the first K batches of as many passes as they need).

    ``spec_cache`` remembers the optimizer each (client class, optimizer factory, config) builds, so a
    round of a hundred clients sharing one factory builds one optimizer, not a hundred. A client class
    with its own ``make_optimizer`` (which may read per-client fields) is asked every time."""
    config = dict(task.config)
    epochs = int(config.get("epochs", client.epochs))
    batch_size = int(config.get("batch_size", client.batch_size))
    cache = spec_cache if type(client).make_optimizer is Client.make_optimizer else None
    key = (type(client), id(client.optimizer), repr(sorted(config.items())))
    if cache is not None and key in cache:
        spec = cache[key]
    else:
        spec = optim.optimizer_spec(client.make_optimizer(model, config))
        if cache is not None:
            cache[key] = spec
    generator = torch.Generator().manual_seed(task.seed)
    if dpsgd.is_private(client):  # DP-SGD: ⌈1/q⌉ Poisson batches per epoch
        steps = client.steps_per_epoch
        rows, sizes = dpsgd.poisson_batches(client, generator, epochs)
    else:
        steps = math.ceil(client.num_train / batch_size)
        local_steps = client.task_steps(config)
        if local_steps is not None:  # K batches cut from as many passes as they need (Client.fit's local steps)
            epochs = math.ceil(local_steps / steps) if steps else 0
        rows, sizes = _shuffled_batches(client, generator, epochs, batch_size)
        if local_steps is not None:
            rows, sizes = rows[:local_steps], sizes[:local_steps]
    inputs = local.vectorised_inputs(config, dict(task.state)) if local is not None else config
    numbers = {k: float(v) for k, v in inputs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    vectors = {k: v for k, v in inputs.items() if isinstance(v, np.ndarray)}
    return ClientPlan(task, client, rows, sizes, epochs, steps, spec, numbers, vectors)


def _shuffled_batches(
    client: Client, generator: torch.Generator, epochs: int, batch_size: int
) -> tuple[torch.Tensor, tuple[int, ...]]:
    """Every step's rows ``(steps, batch_size)`` (an epoch: one shuffle, cut into batches; the last one's tail
    is padding at row 0, masked out later) and the batch sizes, drawn as :meth:`Client._run_epoch` draws them."""
    n, steps = client.num_train, math.ceil(client.num_train / batch_size)
    indices = torch.from_numpy(client.train_indices)
    padded = torch.zeros(epochs, steps * batch_size, dtype=torch.int64)
    for epoch in range(epochs):
        padded[epoch, :n] = indices[torch.randperm(n, generator=generator)]
    sizes = ([batch_size] * (steps - 1) + [n - (steps - 1) * batch_size]) * epochs if steps else []
    return padded.view(epochs * steps, batch_size), tuple(sizes)
