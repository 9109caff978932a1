"""Small frozen records that cross process boundaries: tasks out, updates and failures back.

They hold only plain Python values and CPU tensors, so they pickle cheaply under every start
method and never carry a model, a DataLoader or a Hydra object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class FitTask:
    """One client's local training in one round.

    ``seed`` seeds the task's own ``torch.Generator`` (derived from ``(run seed, round, client id)``),
    so a task gives the same result wherever and however often it runs. ``config`` is the fresh
    per-client dict from ``Strategy.client_config``. ``state`` is the client's state as the server
    committed it after the previous round the client took part in (``{}`` before its first), the same
    for every attempt of the task; see :mod:`fedsim.client.state`.
    """

    client_id: int
    round_num: int
    seed: int
    config: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClientUpdate:
    """What a client sends back: its trained weights as one flat CPU tensor and how many examples it used.

    ``metrics`` holds scalars such as ``train_loss`` (mean over all local steps); ``epoch_losses`` the
    mean loss of each local epoch. ``worker`` and ``device`` record where the task ran. ``state`` is the
    client's new state (CPU tensors and plain values), which the server commits only if it accepts the
    update. Every executor fills it in: a custom ``fit`` may leave it ``None``, which means "the ``state``
    dict that ``fit`` received, as ``fit`` left it"; a result with ``None`` never reaches the server's commit
    except from ``executor=vmap`` for clients whose state no hook changes (their state stays as it was).
    """

    client_id: int
    round_num: int
    params: torch.Tensor
    num_examples: int
    metrics: dict[str, float] = field(default_factory=dict)
    epoch_losses: tuple[float, ...] = ()
    worker: str = "main"
    device: str = "cpu"
    state: dict[str, Any] | None = None


@dataclass(frozen=True)
class ClientFailure:
    """A client task that raised (or whose worker died or timed out), with the full traceback as text.

    ``fatal``: a misuse that would make the run depend on the executor (a ``Client`` that changed its own
    attributes, a state value that cannot be checkpointed); the server stops the run on it whatever the
    failure policy says.
    """

    client_id: int
    round_num: int
    error: str
    traceback: str
    worker: str = "main"
    attempts: int = 1
    fatal: bool = False


TaskResult = ClientUpdate | ClientFailure


@dataclass(frozen=True)
class EvalTask:
    """Evaluate a group of clients on their local test splits, with the round's global weights and, when the
    algorithm has personal models, with each client's own (``states``: one per client, as committed after the
    round; empty otherwise). Groups are formed from the evaluated clients alone (see
    :mod:`fedsim.client.evaluation`), so results never depend on the executor or the number of workers."""

    client_ids: tuple[int, ...]
    round_num: int
    states: tuple[dict[str, Any], ...] = ()

    @property
    def client_id(self) -> int:
        """The group's first client: what executors key the task's result by (groups never overlap)."""
        return self.client_ids[0]


@dataclass(frozen=True)
class ClientScore:
    """One client's evaluation: test examples, then loss and accuracy of the global model and, when the algorithm
    has one, of its personal model (``personal=False``: the client has none yet and its personal values are the
    global model's)."""

    client_id: int
    num_examples: int
    loss: float
    accuracy: float
    personal_loss: float | None = None
    personal_accuracy: float | None = None
    personal: bool = False


@dataclass(frozen=True)
class EvalResult:
    """The scores of an :class:`EvalTask`'s clients, in its order; ``client_id`` is the group's first client."""

    client_id: int
    round_num: int
    scores: tuple[ClientScore, ...]
    worker: str = "main"
