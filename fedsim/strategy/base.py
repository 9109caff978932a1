"""Strategy: how the server turns client updates into the next global model.

One method is required, :meth:`Strategy.aggregate`. The other hooks have sensible defaults:
:meth:`sample` (uniform without replacement), :meth:`client_config` (a fresh dict per client),
:meth:`state_dict` / :meth:`load_state_dict` (for checkpoints; stateless strategies return ``{}``) and
:meth:`check` (reject an unworkable number of clients per round before any training), :meth:`setup`
(told about the run once: parameter layout, clients, seed, run directory), :meth:`round_metrics`
(scalars of its own, logged as ``strategy/<name>``) and :meth:`personal_entries` (what clients never upload).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fedsim.client.local_training import LocalTraining, gradients, hook_before_step, personalises
from fedsim.core.types import ClientUpdate
from fedsim.strategy.context import RunContext


class Strategy:
    """Base class for aggregation strategies. Subclass it and implement :meth:`aggregate`.

    ``keeps_stragglers``: whether updates of simulated stragglers (clients told to do fewer local
    epochs, see :mod:`fedsim.server.stragglers`) reach :meth:`aggregate`; the server drops them otherwise.

    ``needs``: what :meth:`aggregate` reads of the round (:mod:`fedsim.server.stage`): ``{"updates"}`` (the default)
    when it looks at each client's update on its own (Krum, the median, FLTrust, q-FFL...); ``frozenset()`` when it
    is a function of their (example-weighted) mean alone, as FedAvg, FedProx and the server optimizers are: then it
    also runs where only the aggregate reaches the server (central DP's noisy mean, secure aggregation). A subclass
    that overrides :meth:`aggregate` without declaring ``needs`` itself is taken to need the individual updates.
    """

    keeps_stragglers: bool = True
    needs: frozenset[str] = frozenset({"updates"})

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass that overrides :meth:`aggregate` does not inherit a parent's ``needs``: undeclared, it needs
        the individual updates (a FedAvg subclass that weighs each update must not pass for a mean)."""
        super().__init_subclass__(**kwargs)
        if "aggregate" in cls.__dict__ and "needs" not in cls.__dict__:
            cls.needs = frozenset({"updates"})

    def setup(self, context: RunContext) -> None:
        """Called once when the server is built (before any training, so a ``ValueError`` here is reported
        like a bad config value), and again on a resume, just before :meth:`load_state_dict`: the parameter
        layout, client count and sizes, seed and run directory. Keep what you need on ``self``; the
        default keeps nothing."""

    def personal_entries(self) -> torch.Tensor | None:
        """The entries of the flat vector that never leave the clients (a boolean mask, True on each; known after
        :meth:`setup`), or ``None`` (the default): clients upload every entry. A client uploads only the other
        entries: the codecs, error feedback and an attack see those alone, the bytes count those alone, and the
        server rebuilds each update with its personal entries equal to the global weights' (what it sent), so
        :meth:`aggregate` still receives full vectors. FedPer, FedRep, FedBN and FedSA-LoRA declare theirs."""
        return None

    def local_training(self) -> LocalTraining | None:
        """The client half of this algorithm, or ``None`` when clients train plainly (the default)."""
        return None

    def sample(self, round_num: int, num_clients: int, clients_per_round: int, rng: np.random.Generator) -> list[int]:
        """Ids of the clients that train this round, sorted.

        ``rng`` is seeded by the server from ``(seed, round)`` only, so sampling is a pure function of
        the seed and the round: it costs O(clients_per_round), whatever ``num_clients`` is.
        """
        chosen = rng.choice(num_clients, size=clients_per_round, replace=False)
        return sorted(int(c) for c in chosen)

    def client_config(self, round_num: int, client_id: int) -> dict[str, Any]:
        """Per-client instructions for this round (e.g. ``{"epochs": 2}``); a fresh dict every call."""
        return {}

    def check(self, clients_per_round: int) -> None:
        """Raise ValueError with one line if this strategy cannot work with that many clients per round;
        called once before any training. The default accepts any number."""

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        """Return the new global parameters (flat). ``updates`` come sorted by client id and non-empty."""
        raise NotImplementedError(f"{type(self).__name__} must implement aggregate()")

    def round_metrics(self, round_num: int) -> dict[str, float]:
        """Scalars of your own for the round just aggregated (e.g. a norm, a chosen client); the server
        logs them as ``strategy/<name>`` in ``metrics.jsonl`` and TensorBoard. Called after every
        :meth:`aggregate`; the default reports nothing."""
        return {}

    def client_metrics(self, round_num: int) -> dict[int, dict[str, float]]:
        """Per-client values of your own for the round just aggregated (e.g. each client's weight or trust score):
        ``{client_id: {name: number}}``, for clients whose update reached :meth:`aggregate`. The server puts them in
        each client's row of ``metrics.jsonl`` under ``"strategy"`` and draws each name's histogram over the clients
        in TensorBoard as ``client/strategy/<name>``. Called after every :meth:`aggregate`; the default reports
        nothing."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume this strategy (tensors and plain values only)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


__all__ = [
    "LocalTraining",
    "Strategy",
    "gradients",
    "hook_before_step",
    "personalises",
]  # the client half: fedsim.client.local_training
