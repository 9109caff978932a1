"""The frozen base (a LoRA model's base weights, which never travel), built once and shared read-only with the workers.

The parent builds the model once in :meth:`ProcessExecutor.start`, moves its frozen entries (those
:func:`~fedsim.core.params.frozen_entries` selects) to shared memory and sends them with the run. Each worker still
builds its own model (the module structure; the adapters are initialised there), then checks that its frozen entries
equal the shared ones (a comparison, not a SHA-256 of every entry in every worker) and, on a CPU worker, replaces its
frozen parameters by the shared tensors, so that the base sits in memory once however many workers there are. Frozen
parameters (``requires_grad=False``) are never written by training: no gradient, no optimizer step. Frozen buffers
are only compared: a forward pass may update a float buffer, and each worker keeps its own as before.
"""

from __future__ import annotations

import torch
from torch import nn

from fedsim.core.params import frozen_entries


def shared_frozen_base(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s frozen entries (name -> tensor), detached, on the CPU and in shared memory, ready to send."""
    return {name: value.detach().cpu().contiguous().share_memory_() for name, value in frozen_entries(model)}


def adopt_frozen_base(model: nn.Module, shared: dict[str, torch.Tensor], device: torch.device) -> str | None:
    """Check that ``model``'s frozen entries are ``shared``'s (names, shapes, dtypes, values) and, on a CPU device,
    make its frozen parameters use the shared tensors. Returns ``None``, or the first difference in a few words."""
    own = dict(frozen_entries(model))
    if own.keys() != shared.keys():
        extra, missing = sorted(own.keys() - shared.keys()), sorted(shared.keys() - own.keys())
        return f"entries {extra[:3]} not in the server's, {missing[:3]} missing"
    for name, value in own.items():
        theirs = shared[name]
        if value.shape != theirs.shape or value.dtype != theirs.dtype:
            return f"{name}: {tuple(value.shape)} {value.dtype} against {tuple(theirs.shape)} {theirs.dtype}"
        if not torch.equal(value.detach().cpu(), theirs):
            return f"{name}: other values"
    if device.type == "cpu":
        frozen = {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
        state = model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name in own.keys() & frozen:
                state[name].data = shared[name]
    return None
