"""Flat parameter vectors: the one representation of a model's weights that strategies see.

A model's floating-point state (parameters and float buffers, in ``state_dict`` order) is packed
into one 1-D tensor. Non-float buffers (BatchNorm's ``num_batches_tracked``, an integer lookup table) are
not federated: every task starts with the values they had when its executor built the model
(:func:`fixed_state`, :func:`restore_fixed_state`), so no task sees what an earlier one left there.

A model that sets the class attribute ``federates_trainable_only = True`` (a language model with frozen base weights
and LoRA adapters, :mod:`fedsim.models.hf_lm`) federates only its trainable parameters (``requires_grad``, each
shared tensor once): its frozen entries are built identically on every worker (:func:`frozen_hash` checks it) and
never travel.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ParamLayout:
    """Names, shapes and dtypes of the federated entries of a model's ``state_dict``, in flat-vector order.

    ``buffers`` names the entries that are buffers (e.g. BatchNorm's running statistics), not trained
    parameters. :meth:`slice` and :meth:`slices` say where each entry lives in the flat vector, and
    :meth:`matching` selects entries by a regular expression (e.g. ``"^fc2\\."`` for a FedPer head).
    """

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    dtypes: tuple[torch.dtype, ...]
    buffers: frozenset[str] = frozenset()

    @classmethod
    def of(cls, model: nn.Module) -> ParamLayout:
        """The layout of ``model``'s federated entries (see the module's docstring)."""
        entries = federated_entries(model)
        parameter_names = {name for name, _ in model.named_parameters()}
        return cls(
            names=tuple(k for k, _ in entries),
            shapes=tuple(v.shape for _, v in entries),
            dtypes=tuple(v.dtype for _, v in entries),
            buffers=frozenset(k for k, _ in entries if k not in parameter_names),
        )

    @property
    def numel(self) -> int:
        return sum(int(torch.Size(s).numel()) for s in self.shapes)

    def slices(self) -> dict[str, slice]:
        """Every entry's ``slice`` of the flat vector, by name."""
        result, offset = {}, 0
        for name, shape in zip(self.names, self.shapes, strict=True):
            size = int(torch.Size(shape).numel())
            result[name] = slice(offset, offset + size)
            offset += size
        return result

    def slice(self, name: str) -> slice:
        """Where entry ``name`` lives in the flat vector; KeyError names the known entries."""
        slices = self.slices()
        if name not in slices:
            raise KeyError(f"{name!r} is not an entry of the model (entries: {', '.join(self.names)})")
        return slices[name]

    def matching(self, pattern: str) -> tuple[str, ...]:
        """Names of the entries that ``re.search(pattern, name)`` matches, in flat-vector order."""
        compiled = re.compile(pattern)
        return tuple(name for name in self.names if compiled.search(name))

    def mask(self, names: Iterable[str]) -> torch.Tensor:
        """A boolean flat vector that is True on the given entries."""
        slices, mask = self.slices(), torch.zeros(self.numel, dtype=torch.bool)
        for name in names:
            mask[slices[name]] = True
        return mask


def federated_entries(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The ``state_dict`` entries that are federated, in flat-vector order: every float entry, or for a model that
    declares ``federates_trainable_only``, its trainable parameters only."""
    state = model.state_dict()
    if not getattr(model, "federates_trainable_only", False):
        return [(k, v) for k, v in state.items() if v.is_floating_point()]
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    return [(k, v) for k, v in state.items() if k in trainable and v.is_floating_point()]


NO_FROZEN_WEIGHTS = hashlib.sha256().hexdigest()
"""What :func:`frozen_hash` gives for a model without frozen weights (every model that federates all of them)."""


def checkpoints_activations(model: nn.Module) -> bool:
    """Whether any part of ``model`` has transformers' activation (gradient) checkpointing on, which the torch.func
    transforms of ``executor=vmap`` and DP-SGD cannot run (``is_activation_checkpointing``; before transformers 5,
    ``is_gradient_checkpointing``)."""
    for module in model.modules():
        flag = getattr(module, "is_activation_checkpointing", None)
        if (getattr(module, "is_gradient_checkpointing", False) if flag is None else flag) is True:
            return True
    return False


def frozen_entries(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The float ``state_dict`` entries that are not federated and do not share storage with a federated one: the
    frozen base of a ``federates_trainable_only`` model, nothing for any other model. Every worker must build the
    same frozen base, since it never travels."""
    federated = federated_entries(model)
    names = {k for k, _ in federated}
    pointers = {v.data_ptr() for _, v in federated}
    return [
        (name, value)
        for name, value in model.state_dict().items()
        if value.is_floating_point() and name not in names and value.data_ptr() not in pointers
    ]


def frozen_hash(model: nn.Module) -> str:
    """SHA-256 of :func:`frozen_entries`: names, shapes, dtypes and bytes."""
    digest = hashlib.sha256()
    for name, value in frozen_entries(model):
        digest.update(f"{name}:{tuple(value.shape)}:{value.dtype};".encode())
        digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def flatten(model: nn.Module) -> torch.Tensor:
    """Copy the model's federated entries into a new flat float32 CPU tensor."""
    tensors = [v.detach().reshape(-1).float().cpu() for _, v in federated_entries(model)]
    return torch.cat(tensors) if tensors else torch.zeros(0)


def load_flat(model: nn.Module, flat: torch.Tensor) -> None:
    """Write a flat vector (as made by :func:`flatten`) into the model's federated entries, in place."""
    offset = 0
    with torch.no_grad():
        for _, value in federated_entries(model):
            n = value.numel()
            value.copy_(flat[offset : offset + n].view_as(value))
            offset += n
    if offset != flat.numel():
        raise ValueError(f"flat vector has {flat.numel()} values but the model holds {offset}")


def fixed_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the model's non-float ``state_dict`` entries, to restore before every task."""
    return {k: v.detach().clone() for k, v in model.state_dict().items() if not v.is_floating_point()}


def restore_fixed_state(model: nn.Module, saved: dict[str, torch.Tensor]) -> None:
    """Put the entries :func:`fixed_state` copied back into ``model``, in place."""
    state = model.state_dict()
    with torch.no_grad():
        for name, value in saved.items():
            state[name].copy_(value)
