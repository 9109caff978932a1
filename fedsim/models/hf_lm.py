"""Hugging Face causal language models, and the LoRA adapter that makes only a few weights travel.

``model=hf_causal_lm`` builds a ``transformers`` causal LM from a local pretrained directory (``model.path``) or,
with ``model.path=null``, from a few config keys, randomly initialised from the run seed. ``adapter=lora`` wraps it
with PEFT's LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022): the base weights are
frozen and only the adapters are trained and federated (:class:`CausalLM` declares ``federates_trainable_only``, see
:mod:`fedsim.core.params`). ``transformers`` and ``peft`` are imported only when a model is built.

``adapter=ffa_lora`` (``train_a: false``) is FFA-LoRA (Sun, Li, Dai, Ding, "Improving LoRA in Privacy-preserving
Federated Learning", ICLR 2024): every ``A`` stays frozen at its seeded initialisation, identical on every worker,
and only the ``B`` matrices are trained and federated. With ``A`` shared and fixed, ``ΔW = s·B·A`` is linear in
``B``, so FedAvg's average of the ``B``s gives exactly the average of the clients' ``ΔW``s (plain LoRA averages ``A``
and ``B`` apart, and the mean of products is not the product of means). Half the adapter travels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedsim.core.extras import require
from fedsim.core.seeding import init_seed
from fedsim.models.precision import check_precision, prepare, trainable_in_float32

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
        """Logits for every position of ``x``, in float32 (also of a half-precision base: the loss is in float32)."""
        logits: torch.Tensor = self.lm(input_ids=x).logits
        return logits.float()


@dataclass(frozen=True)
class _Size:
    """The architecture keys of a randomly initialised model (``model.path=null``)."""

    model_type: str
    vocab_size: int
    num_layers: int
    hidden_size: int
    num_heads: int
    dropout: float

    def __post_init__(self) -> None:
        for key in ("vocab_size", "num_layers", "hidden_size", "num_heads"):
            if getattr(self, key) < 1:
                raise ValueError(f"model.{key} must be >= 1 (got {getattr(self, key)})")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.hidden_size ({self.hidden_size}) must be a multiple of model.num_heads ({self.num_heads}): "
                "each attention head takes an equal share"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1) (got {self.dropout})")

    def config(self, transformers: Any, context_length: int, **extra: Any) -> Any:
        """The ``transformers`` config of this size, no BOS/EOS ids, every dropout the model has set to ``dropout``
        (residual, embedding, attention; the names differ between architectures)."""
        if self.model_type not in transformers.CONFIG_MAPPING:
            raise ValueError(
                f"model.model_type={self.model_type} is not a transformers architecture; use e.g. gpt2 or llama"
            )
        config = transformers.AutoConfig.for_model(
            self.model_type,
            vocab_size=self.vocab_size,
            num_hidden_layers=self.num_layers,
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_heads,
            max_position_embeddings=context_length,
            bos_token_id=None,
            eos_token_id=None,
            **extra,
        )
        for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout_prob", "attention_probs_dropout_prob"):
            if hasattr(config, name):
                setattr(config, name, self.dropout)
        return config


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
    dtype: str = "float32",
    gradient_checkpointing: bool = False,
) -> CausalLM:
    """A causal LM from the local pretrained directory ``path`` (``from_pretrained(..., local_files_only=True)``),
    or with ``path=None`` a ``model_type`` model of the given size, initialised from ``seed`` only (every worker
    builds the same weights). ``vocab_size`` defaults to the data's ``num_classes`` (the tokenizer's vocabulary),
    ``context_length`` to the data's sequence length ``input_shape[0]``; ``dropout`` sets the model's dropouts
    (residual, embedding, attention) for a randomly initialised model. ``dtype`` and ``gradient_checkpointing``:
    :mod:`fedsim.models.precision` (a seeded model is initialised in float32, then cast)."""
    wanted = check_precision(dtype, gradient_checkpointing)
    if path is not None:
        return CausalLM(prepare(_pretrained(path, wanted), wanted, gradient_checkpointing))
    data_needs = {"vocab_size": (vocab_size, num_classes), "context_length": (context_length, int(input_shape[0]))}
    for key, (value, data) in data_needs.items():  # the data's token ids, its positions
        if value is not None and value < data:
            raise ValueError(f"model.{key}={value} is smaller than the data needs ({data}); null takes the data's")
    transformers = require("transformers", "model=hf_causal_lm", "llm")
    size = _Size(model_type, vocab_size or num_classes, num_layers, hidden_size, num_heads, dropout)
    config = size.config(transformers, context_length or int(input_shape[0]))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        lm = transformers.AutoModelForCausalLM.from_config(config)
    return CausalLM(prepare(lm, wanted, gradient_checkpointing))


def _pretrained(path: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The model saved in the directory ``path``; one line naming ``model.path`` and how to get a model otherwise."""
    if not Path(path).expanduser().is_dir():
        raise FileNotFoundError(f"model.path={path} is not a directory; {_HOW_TO_GET}")
    transformers = require("transformers", "model=hf_causal_lm", "llm")
    try:
        model: nn.Module = transformers.AutoModelForCausalLM.from_pretrained(
            Path(path).expanduser(), local_files_only=True, **_loaded_in(dtype)
        )
    except (OSError, ValueError, KeyError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise FileNotFoundError(f"model.path={path} holds no readable model ({first}); {_HOW_TO_GET}") from None
    return model


def _loaded_in(dtype: torch.dtype) -> dict[str, Any]:
    """``from_pretrained``'s argument that reads the weights straight into ``dtype`` (none for float32, the default:
    no float32 copy of a half-precision base is ever made)."""
    return {} if dtype == torch.float32 else {"dtype": dtype}


@dataclass(frozen=True)
class LoRA:
    """PEFT's LoRA adapter (Hu et al., ICLR 2022): ``r`` (rank), ``alpha`` (scale ``alpha / r``), ``dropout`` and the
    ``target_modules`` it wraps (module names of the base model, e.g. ``c_attn`` for GPT-2; empty: PEFT's default
    for the model type). The base is frozen; only the adapters are trained and federated.

    The adapters are initialised from ``seed`` (the run seed) alone, through :func:`~fedsim.core.seeding.init_seed`,
    the stream the server's initial model comes from: every worker builds the same ``A``. ``train_a=False`` is
    FFA-LoRA (see the module's docstring): ``A`` is frozen there, covered by the frozen-base hash, and only ``B``
    is federated."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=list)
    train_a: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"adapter.r must be >= 1 (got {self.r})")
        if not self.alpha > 0:
            raise ValueError(
                f"adapter.alpha must be > 0 (got {self.alpha}): the adapters are scaled by alpha / r (at 0 they "
                "would train nothing)"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"adapter.dropout must be in [0, 1) (got {self.dropout})")

    def apply(self, model: nn.Module) -> nn.Module:
        """``model`` (a :class:`CausalLM`) with LoRA adapters on its target modules, its base frozen."""
        if not isinstance(model, (CausalLM, SequenceClassifier)):
            raise ValueError(
                "adapter=lora needs a Hugging Face model (model=hf_causal_lm or hf_seq_cls), not "
                f"{type(model).__name__}; use adapter=none"
            )
        peft = require("peft", "adapter=lora", "llm")
        config = peft.LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules) or None,
            task_type=getattr(model, "peft_task_type", None),
        )
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(init_seed(self.seed))
                model.lm = peft.get_peft_model(model.lm, config)
        except ValueError as error:
            raise ValueError(f"adapter.target_modules={list(self.target_modules)}: {error}") from None
        if not self.train_a:
            _freeze_lora_a(model)
        trainable_in_float32(model)  # a half-precision base (model.dtype) keeps float32 adapters and head
        return model


def _freeze_lora_a(model: nn.Module) -> None:
    """Stop training every LoRA ``A`` matrix of ``model`` (FFA-LoRA): it keeps its seeded initialisation."""
    frozen = [p.requires_grad_(False) for name, p in model.named_parameters() if ".lora_A." in name]
    if not frozen:
        raise ValueError(
            "adapter.train_a=false: the model has no LoRA A matrix to freeze; check adapter.target_modules"
        )


def with_adapter(factory: Callable[..., nn.Module], adapter: LoRA, **kwargs: Any) -> nn.Module:
    """``factory(**kwargs)`` with ``adapter`` applied (a module-level function, so that the pair pickles to
    worker processes)."""
    return adapter.apply(factory(**kwargs))


class SequenceClassifier(nn.Module):
    """A ``transformers`` sequence classifier as a fedsim model: token ids ``[B, T]`` (padded on the right with
    ``pad_token_id``) in, one score per class ``[B, C]`` out, so the classic 1-D labels and every classification
    metric apply. Positions holding ``pad_token_id`` are masked out of attention, and the model pools its last
    non-padding token (GPT-2) or its first (BERT-like).

    Under LoRA the classification head is newly initialised, so it is trained and federated beside the adapters
    (PEFT's ``modules_to_save`` for ``peft_task_type`` ``SEQ_CLS``); ``federates_trainable_only`` as for
    :class:`CausalLM`."""

    federates_trainable_only = True
    peft_task_type = "SEQ_CLS"

    def __init__(self, lm: nn.Module, pad_token_id: int) -> None:
        super().__init__()
        self.lm = lm
        self.pad_token_id = pad_token_id

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores of every row of ``x``, in float32."""
        logits: torch.Tensor = self.lm(input_ids=x, attention_mask=(x != self.pad_token_id).long()).logits
        return logits.float()


def hf_seq_cls(
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
    pad_token_id: int = 0,
    seed: int = 0,
    dtype: str = "float32",
    gradient_checkpointing: bool = False,
) -> SequenceClassifier:
    """An ``AutoModelForSequenceClassification`` with ``num_classes`` outputs (the data's classes), from the local
    pretrained directory ``path`` (its new classification head initialised from ``seed``) or, with ``path=None``,
    a ``model_type`` model of the given size initialised from ``seed`` only; ``vocab_size`` (the tokenizer's) is
    then required. ``pad_token_id`` must be the data's padding id (0 for a ``tokenizer.json``, see
    :func:`fedsim.data.tokenizer.load_tokenizer`). Other keys as :func:`hf_causal_lm`."""
    wanted = check_precision(dtype, gradient_checkpointing)
    if pad_token_id < 0:
        raise ValueError(f"model.pad_token_id must be >= 0, the data's padding id (got {pad_token_id})")
    transformers = require("transformers", "model=hf_seq_cls", "llm")
    if path is None and vocab_size is None:
        raise ValueError(
            "model.vocab_size: set it to the tokenizer's vocabulary size (model.path=null builds a new model)"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if path is not None:
            lm = _pretrained_classifier(path, num_classes, pad_token_id, wanted)
        else:
            assert vocab_size is not None  # refused above without one
            size = _Size(model_type, vocab_size, num_layers, hidden_size, num_heads, dropout)
            config = size.config(
                transformers, context_length or int(input_shape[0]), num_labels=num_classes, pad_token_id=pad_token_id
            )
            lm = transformers.AutoModelForSequenceClassification.from_config(config)
    return SequenceClassifier(prepare(lm, wanted, gradient_checkpointing), pad_token_id)


def _pretrained_classifier(
    path: str, num_classes: int, pad_token_id: int, dtype: torch.dtype = torch.float32
) -> nn.Module:
    """The model saved in ``path`` with a classification head of ``num_classes``; one line naming ``model.path``
    otherwise."""
    if not Path(path).expanduser().is_dir():
        raise FileNotFoundError(f"model.path={path} is not a directory; {_HOW_TO_GET}")
    transformers = require("transformers", "model=hf_seq_cls", "llm")
    try:
        model: nn.Module = transformers.AutoModelForSequenceClassification.from_pretrained(
            Path(path).expanduser(),
            local_files_only=True,
            num_labels=num_classes,
            pad_token_id=pad_token_id,
            **_loaded_in(dtype),
        )
    except (OSError, ValueError, KeyError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise FileNotFoundError(f"model.path={path} holds no readable model ({first}); {_HOW_TO_GET}") from None
    return model
