"""Hugging Face causal language models, and the LoRA adapter that makes only a few weights travel.

``model=hf_causal_lm`` builds a ``transformers`` causal LM from a local pretrained directory (``model.path``) or,
with ``model.path=null``, from a few config keys, randomly initialised from the run seed. ``adapter=lora`` wraps it
with PEFT's LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022): the base weights are
frozen and only the adapters are trained and federated (:class:`CausalLM` declares ``federates_trainable_only``, see
:mod:`fedsim.core.params`). ``transformers`` and ``peft`` are imported only when a model is built.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedsim.core.extras import require

_HOW_TO_GET = (
    "download one on a machine with internet (e.g. `huggingface-cli download gpt2 --local-dir DIR`), copy DIR here "
    "and set model.path=DIR, or set model.path=null for a randomly initialised model"
)


class CausalLM(nn.Module):
    """A ``transformers`` causal LM as a fedsim model: token ids ``[B, T]`` in, logits ``[B, T, vocab]`` out (a
    score for every position; the data's labels say which positions count). No attention mask: fedsim's token data
    is padded on the right, and a causal model never looks right, so padding changes no scored position.

    ``federates_trainable_only``: only the trainable parameters (all of them for full fine-tuning, the adapters
    under LoRA) are federated; frozen weights are built identically on every worker."""

    federates_trainable_only = True

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for every position of ``x``."""
        logits: torch.Tensor = self.lm(input_ids=x).logits
        return logits


def hf_causal_lm(
    *,
    input_shape: Sequence[int],
    num_classes: int,
    path: str | None = None,
    model_type: str = "gpt2",
    vocab_size: int | None = None,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 2,
    context_length: int | None = None,
    dropout: float = 0.0,
    seed: int = 0,
) -> CausalLM:
    """A causal LM from the local pretrained directory ``path`` (``from_pretrained(..., local_files_only=True)``),
    or with ``path=None`` a ``model_type`` model of the given size, initialised from ``seed`` only (every worker
    builds the same weights). ``vocab_size`` defaults to the data's ``num_classes`` (the tokenizer's vocabulary),
    ``context_length`` to the data's sequence length ``input_shape[0]``; ``dropout`` sets the model's dropouts
    (residual, embedding, attention) for a randomly initialised model."""
    if path is not None:
        return CausalLM(_pretrained(path))
    transformers = require("transformers", "model=hf_causal_lm", "llm")
    config = transformers.AutoConfig.for_model(
        model_type,
        vocab_size=vocab_size or num_classes,
        num_hidden_layers=num_layers,
        hidden_size=hidden_size,
        num_attention_heads=num_heads,
        max_position_embeddings=context_length or int(input_shape[0]),
        bos_token_id=None,
        eos_token_id=None,
    )
    for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout_prob", "attention_probs_dropout_prob"):
        if hasattr(config, name):
            setattr(config, name, dropout)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return CausalLM(transformers.AutoModelForCausalLM.from_config(config))


def _pretrained(path: str) -> nn.Module:
    """The model saved in the directory ``path``; one line naming ``model.path`` and how to get a model otherwise."""
    if not Path(path).expanduser().is_dir():
        raise FileNotFoundError(f"model.path={path} is not a directory; {_HOW_TO_GET}")
    transformers = require("transformers", "model=hf_causal_lm", "llm")
    try:
        model: nn.Module = transformers.AutoModelForCausalLM.from_pretrained(
            Path(path).expanduser(), local_files_only=True
        )
    except (OSError, ValueError, KeyError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise FileNotFoundError(f"model.path={path} holds no readable model ({first}); {_HOW_TO_GET}") from None
    return model


@dataclass(frozen=True)
class LoRA:
    """PEFT's LoRA adapter (Hu et al., ICLR 2022): ``r`` (rank), ``alpha`` (scale ``alpha / r``), ``dropout`` and the
    ``target_modules`` it wraps (module names of the base model, e.g. ``c_attn`` for GPT-2; empty: PEFT's default
    for the model type). The base is frozen; only the adapters are trained and federated."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"adapter.r must be >= 1 (got {self.r})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"adapter.dropout must be in [0, 1) (got {self.dropout})")

    def apply(self, model: nn.Module) -> nn.Module:
        """``model`` (a :class:`CausalLM`) with LoRA adapters on its target modules, its base frozen."""
        if not isinstance(model, CausalLM):
            raise ValueError(
                f"adapter=lora needs a Hugging Face model (model=hf_causal_lm), not {type(model).__name__}; "
                "use adapter=none"
            )
        peft = require("peft", "adapter=lora", "llm")
        config = peft.LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules) or None,
        )
        try:
            model.lm = peft.get_peft_model(model.lm, config)
        except ValueError as error:
            raise ValueError(f"adapter.target_modules={list(self.target_modules)}: {error}") from None
        return model


def with_adapter(factory: Callable[..., nn.Module], adapter: LoRA, **kwargs: Any) -> nn.Module:
    """``factory(**kwargs)`` with ``adapter`` applied (a module-level function, so that the pair pickles to
    worker processes)."""
    return adapter.apply(factory(**kwargs))
