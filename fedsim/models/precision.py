"""The memory knobs of a Hugging Face model (``model=hf_causal_lm``, ``hf_seq_cls``; docs/language-models.md).

* ``model.dtype`` (``float32``, the default; ``bfloat16``, ``float16``): the dtype the base weights are kept in. Under
  LoRA those are the frozen base, built (or loaded) on every worker and never sent; the trainable adapters stay
  float32 (PEFT casts LoRA's A and B to float32, and :func:`trainable_in_float32` a new classification head), so the
  federated vector, the optimizer and every update are float32 as before. A half-precision base halves the
  memory of the frozen weights in each worker; the logits are cast to float32 before the loss.
* ``model.gradient_checkpointing`` (false): transformers' ``gradient_checkpointing_enable()``
  (``activation_checkpointing_enable()`` since transformers 5; non-reentrant, the KV cache off): the activations of
  each block are recomputed in the backward pass instead of kept. It changes the memory, not the result: the
  gradients are bitwise those without it on CPU.

The float32 default changes nothing: no cast, no hook, no checkpointing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""What ``model.dtype`` takes."""


def dtype_of(name: object) -> torch.dtype:
    """The torch dtype of ``model.dtype=name``; one line naming the key otherwise."""
    if not isinstance(name, str) or name not in DTYPES:
        raise ValueError(f"model.dtype must be one of {', '.join(DTYPES)} (got {name!r})")
    return DTYPES[name]


def check_precision(dtype: object, gradient_checkpointing: object) -> torch.dtype:
    """Both keys checked (one line each) before anything is built; the dtype."""
    if not isinstance(gradient_checkpointing, bool):
        raise ValueError(f"model.gradient_checkpointing must be true or false (got {gradient_checkpointing!r})")
    return dtype_of(dtype)


def prepare(lm: Any, dtype: torch.dtype, gradient_checkpointing: bool) -> Any:
    """``lm`` (a ``transformers`` model) in ``dtype``, with gradient checkpointing if asked (see the module's
    docstring)."""
    if dtype != torch.float32:
        lm.to(dtype)
    if gradient_checkpointing:
        lm.config.use_cache = False  # transformers would warn and turn it off itself
        checkpoint = {"use_reentrant": False}  # the reentrant variant gives frozen inputs' adapters no gradient
        if hasattr(lm, "activation_checkpointing_enable"):  # transformers >= 5; the older name is deprecated there
            lm.activation_checkpointing_enable(activation_checkpointing_kwargs=checkpoint)
        else:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint)
    return lm


def _to_float32(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A forward pre-hook: the module's floating inputs in float32 (its weights are)."""
    return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def trainable_in_float32(model: nn.Module) -> None:
    """Every trainable parameter of ``model`` in float32: a module holding one in another dtype (a classification
    head copied from a half-precision base) is cast, and its inputs too. Nothing happens when they all are."""
    for module in model.modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if own and any(p.dtype != torch.float32 for p in own):
            module.to(torch.float32)
            module.register_forward_pre_hook(_to_float32)
