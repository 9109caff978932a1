"""The server's root dataset: a few clean training examples the server holds and trains on itself.

Defences such as FLTrust (Cao et al., NDSS 2021; :mod:`fedsim.strategy.fltrust`) assume the server can collect a
small clean dataset and compute its own model update from it, the *root update*, against which it judges the
clients'. A strategy asks for one in :meth:`~fedsim.strategy.Strategy.setup`, through
``context.root_trainer(size)``.

What fedsim does, and why:

- The ``size`` examples are drawn once per run, uniformly without replacement, from the training examples the
  clients hold (their ``train_indices``; a client's local test split is never drawn). The draw depends on the run
  seed alone, so a resumed run and every executor get the same examples. The examples stay with their clients as
  well: the server holds copies, as in FLTrust's experiments, where the root dataset is sampled from the training
  data.
- They are clean: a data attack's poisoned copies are separate rows appended to the training tensors
  (:mod:`fedsim.attacks.data_poisoning`) and are never drawn.
- The server trains as the clients do: the first client's class (its loss), epochs, batch size and optimizer, with
  the batch order (and a DP-SGD recipe's noise) drawn from (seed, round) alone. The training runs in the server's
  process, on the CPU and its thread budget, whatever the executor, so its result is the same under every
  executor.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fedsim.client.federation import training_rows
from fedsim.client.scoring import example_losses
from fedsim.core.params import load_flat
from fedsim.core.seeding import root_rng, root_seed

if TYPE_CHECKING:
    from fedsim.client.base import Client
    from fedsim.data.tensor_data import TensorData

ROOT_CLIENT_ID = -1
"""The ``client_id`` of the server's own training task (no client has a negative id)."""


class RootTrainer:
    """Trains a copy of the global model on the root examples (``indices``) with ``client``'s recipe."""

    def __init__(self, model: nn.Module, client: Client, data: TensorData, seed: int) -> None:
        self.model, self.client, self.data, self.seed = model, client, data, seed

    @property
    def indices(self) -> np.ndarray:
        """The root examples' rows in the training data (sorted)."""
        return self.client.train_indices

    def train(self, round_num: int, global_params: torch.Tensor) -> torch.Tensor:
        """The flat weights after one local-training task on the root examples, started from ``global_params``
        (float32, like a client's update)."""
        load_flat(self.model, global_params)
        generator = torch.Generator().manual_seed(root_seed(self.seed, round_num))
        return self.client.fit(self.model, self.data, generator=generator, round_num=round_num).params

    def loss(self, params: torch.Tensor) -> float:
        """The mean loss (the recipe client's ``per_example_loss``, summed in float64) of the model with weights
        ``params`` on the root examples, in evaluation mode."""
        load_flat(self.model, params)
        losses, _ = example_losses(self.client, self.model, self.data, torch.from_numpy(self.indices))
        return float(losses.double().sum()) / len(losses)


def root_trainer(
    size: int,
    *,
    model: nn.Module,
    clients: Sequence[Client],
    data: TensorData,
    seed: int,
    field: str = "strategy.root_size",
) -> RootTrainer:
    """A :class:`RootTrainer` over ``size`` examples drawn from the clients' clean training examples.

    ``model`` is copied (the caller's is never trained); ``field`` names the setting in the one-line ``ValueError``
    for a ``size`` the clients' data cannot supply.
    """
    pool = np.unique(training_rows(clients))
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= len(pool):
        raise ValueError(
            f"{field} must be an integer between 1 and the {len(pool)} training examples the clients "
            f"hold (got {size!r})"
        )
    indices = np.sort(root_rng(seed).choice(pool, size=size, replace=False))
    recipe = copy.copy(clients[0])  # its class (the loss), epochs, batch size and optimizer
    recipe.client_id = ROOT_CLIENT_ID
    recipe.train_indices, recipe.test_indices = indices, np.zeros(0, dtype=np.int64)
    return RootTrainer(copy.deepcopy(model).cpu(), recipe, data, seed)
