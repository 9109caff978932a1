"""Flat parameter vectors: the one representation of a model's weights that strategies see.

A model's floating-point state (parameters and float buffers, in ``state_dict`` order) is packed
into one 1-D tensor. Non-float buffers, if a model has any, are not federated: they keep the values
of the model they live in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ParamLayout:
    """Names, shapes and dtypes of the federated entries of a model's ``state_dict``."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    dtypes: tuple[torch.dtype, ...]

    @classmethod
    def of(cls, model: nn.Module) -> "ParamLayout":
        entries = [(k, v) for k, v in model.state_dict().items() if v.is_floating_point()]
        return cls(
            names=tuple(k for k, _ in entries),
            shapes=tuple(v.shape for _, v in entries),
            dtypes=tuple(v.dtype for _, v in entries),
        )

    @property
    def numel(self) -> int:
        return sum(int(torch.Size(s).numel()) for s in self.shapes)


def flatten(model: nn.Module) -> torch.Tensor:
    """Copy the model's float state into a new flat float32 CPU tensor."""
    state = model.state_dict()
    tensors = [v.detach().reshape(-1).float().cpu() for v in state.values() if v.is_floating_point()]
    return torch.cat(tensors) if tensors else torch.zeros(0)


def load_flat(model: nn.Module, flat: torch.Tensor) -> None:
    """Write a flat vector (as made by :func:`flatten`) into the model's float state, in place."""
    state = model.state_dict()
    offset = 0
    with torch.no_grad():
        for value in state.values():
            if not value.is_floating_point():
                continue
            n = value.numel()
            value.copy_(flat[offset : offset + n].view_as(value))
            offset += n
    if offset != flat.numel():
        raise ValueError(f"flat vector has {flat.numel()} values but the model holds {offset}")
