"""Existing per-user code as fedsim clients: objects with ``train(state_dict) -> state_dict``.

A common hand-written simulation keeps one object per simulated user, holding its own data and settings,
with a method that takes the global model's ``state_dict``, trains locally and returns the new one.
:class:`StateDictClient` wraps such an object so that it runs in a :class:`~fedsim.Server` with any
strategy without a client half, under the serial, process and Ray executors, with the same answers bit
for bit. The page to read is docs/adapters.md.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from fedsim.client.base import Client
from fedsim.client.local_training import LocalTraining
from fedsim.core.types import ClientUpdate
from fedsim.data.tensor_data import TensorData

EXTRAS = ("config", "generator", "seed", "state")
"""Keyword arguments that ``train`` receives when its signature names them (or takes ``**kwargs``)."""


class StateDictClient(Client):
    """Client ``client_id`` whose local training is ``user.train(state_dict)``.

    ``user.train`` receives a copy of the global model's ``state_dict`` (on the worker's device) and returns
    the trained ``state_dict``, or ``(state_dict, num_examples)``, or ``(state_dict, num_examples, metrics)``
    (``metrics``: a dict of numbers; a ``train_loss`` there becomes the round's ``train/loss``). The count
    weighs the update in FedAvg; when ``train`` returns none, ``num_examples`` given here is used. It must
    match the model built by the server's ``model_factory``: same keys, same shapes.

    If ``train``'s signature names any of :data:`EXTRAS`, it also receives: ``seed`` (the task's seed, an
    int), ``generator`` (a ``torch.Generator`` seeded with it), ``config`` (the strategy's per-client dict,
    e.g. ``epochs`` for a simulated straggler) and ``state`` (the client's state dict, see docs/adapters.md).

    ``user`` is put back as it was after every task (it is a task attribute): whatever ``train`` leaves on
    ``self`` is lost under every executor alike. It must pickle, to reach process and Ray workers.
    """

    task_attributes = ("user",)

    def __init__(self, client_id: int, user: Any, *, num_examples: int | None = None) -> None:
        super().__init__(client_id, ())
        if not callable(getattr(user, "train", None)):
            raise TypeError(f"client {client_id}: {type(user).__qualname__} has no train(state_dict) method")
        self.user = user
        count = None if num_examples is None else _positive_int(num_examples, f"client {client_id}: num_examples")
        self.num_examples = count
        self.extras = accepted_extras(user.train)

    def __repr__(self) -> str:
        return f"StateDictClient(id={self.client_id}, user={type(self.user).__qualname__})"

    @property
    def num_train(self) -> int:
        """``num_examples`` as given here (0 when not given): what a strategy sees before any round."""
        return self.num_examples or 0

    def fit(
        self,
        model: nn.Module,
        data: TensorData,
        *,
        config: dict[str, Any] | None = None,
        generator: torch.Generator,
        round_num: int = 0,
        local: LocalTraining | None = None,
        state: dict[str, Any] | None = None,
    ) -> ClientUpdate:
        """``user.train`` on a copy of ``model``'s weights; ``model`` and ``data`` are not trained on."""
        who = f"client {self.client_id}"
        if local is not None:
            raise TypeError(
                f"{who}: the strategy's client half {type(local).__name__} changes local training, which "
                "train(state_dict) cannot apply; use a strategy without one (FedAvg, FedAdam, median...)"
            )
        config = dict(config or {})
        if config and "config" not in self.extras:
            raise TypeError(
                f"{who}: the round's config {sorted(config)} would be ignored; add a config argument to train()"
            )
        offered = {"config": config, "generator": generator, "seed": generator.initial_seed(), "state": state}
        returned = self.user.train(_copy(model.state_dict()), **{name: offered[name] for name in self.extras})
        trained, num_examples, metrics = self._unpack(returned, who)
        return ClientUpdate(
            client_id=self.client_id,
            round_num=round_num,
            params=flat_state_dict(trained, model.state_dict(), who),
            num_examples=num_examples,
            metrics=metrics,
            device=str(next(model.parameters()).device),
        )

    def _unpack(self, returned: Any, who: str) -> tuple[Any, int, dict[str, float]]:
        """``(state_dict, num_examples, metrics)`` from any of the three return forms."""
        parts = tuple(returned) if isinstance(returned, tuple) else (returned,)
        if not 1 <= len(parts) <= 3:
            raise TypeError(
                f"{who}: train() returned a tuple of {len(parts)}; expected state_dict, "
                "(state_dict, num_examples) or (state_dict, num_examples, metrics)"
            )
        if len(parts) == 1 and self.num_examples is None:
            raise TypeError(
                f"{who}: train() returned no example count; return (state_dict, num_examples) "
                "or give StateDictClient num_examples="
            )
        count = parts[1] if len(parts) > 1 else self.num_examples
        metrics = parts[2] if len(parts) > 2 else {}
        if not isinstance(metrics, Mapping):
            raise TypeError(f"{who}: train()'s metrics are a {type(metrics).__name__}, not a dict")
        return parts[0], _positive_int(count, f"{who}: train()'s num_examples"), dict(metrics)


def flat_state_dict(trained: Any, reference: Mapping[str, torch.Tensor], who: str) -> torch.Tensor:
    """``trained``'s float entries as one flat float32 CPU vector, in ``reference``'s order (as
    :func:`fedsim.core.params.flatten` packs a model); a ``ValueError`` or ``TypeError`` naming ``who`` and the
    first thing wrong when ``trained`` is not a ``state_dict`` with ``reference``'s keys and shapes. Non-float
    entries (e.g. BatchNorm's ``num_batches_tracked``) are checked but not federated."""
    if not isinstance(trained, Mapping):
        raise TypeError(f"{who}: train() returned a {type(trained).__name__}, not a state_dict (a dict of tensors)")
    missing = [name for name in reference if name not in trained]
    unexpected = [name for name in trained if name not in reference]
    if missing or unexpected:
        raise ValueError(
            f"{who}: the returned state_dict does not match the model: missing keys {missing[:3]}, "
            f"unexpected keys {unexpected[:3]} ({len(missing)} and {len(unexpected)} in all)"
        )
    for name, expected in reference.items():
        value = trained[name]
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{who}: the returned state_dict's {name!r} is a {type(value).__name__}, not a tensor")
        if value.shape != expected.shape:
            raise ValueError(
                f"{who}: the returned state_dict's {name!r} has shape {tuple(value.shape)}, "
                f"the model's has {tuple(expected.shape)}"
            )
    floats = [name for name, value in reference.items() if value.is_floating_point()]
    tensors = [trained[name].detach().reshape(-1).float().cpu() for name in floats]
    return torch.cat(tensors) if tensors else torch.zeros(0)


def from_user_objects(users: Sequence[Any], *, num_examples: Sequence[int] | None = None) -> list[StateDictClient]:
    """One :class:`StateDictClient` per object, client ids 0, 1, ... in the given order (as a Server needs)."""
    if num_examples is not None and len(num_examples) != len(users):
        raise ValueError(f"num_examples has {len(num_examples)} entries for {len(users)} user objects")
    counts = list(num_examples) if num_examples is not None else [None] * len(users)
    return [StateDictClient(i, user, num_examples=n) for i, (user, n) in enumerate(zip(users, counts, strict=True))]


def no_shared_data(input_shape: Sequence[int]) -> TensorData:
    """An empty ``train_data`` for the Server when every client brings its own data.

    ``input_shape`` is one example's shape as the model takes it: process and Ray workers run the model once
    on this (empty) data when they start, so a wrong shape fails there."""
    return TensorData(torch.zeros(0, *input_shape), torch.zeros(0, dtype=torch.int64), num_classes=0)


def accepted_extras(train: Any) -> tuple[str, ...]:
    """Which of :data:`EXTRAS` ``train`` takes as keyword arguments (all of them if it takes ``**kwargs``)."""
    try:
        parameters = inspect.signature(train).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: the plain form
        return ()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return EXTRAS
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in parameters if p.name in EXTRAS and p.kind in keyword)


def _copy(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A private copy of a ``state_dict`` (keeping its ``_metadata``, which ``load_state_dict`` reads)."""
    for name, value in state_dict.items():
        state_dict[name] = value.detach().clone()
    return state_dict


def _positive_int(value: Any, what: str) -> int:
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be a positive integer (got {value!r})") from None
    if number <= 0 or isinstance(value, bool):
        raise ValueError(f"{what} must be a positive integer (got {value!r})")
    return number
