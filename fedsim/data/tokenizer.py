"""The text readers' tokenizer: one read from a file or directory, or one trained on the training split.

:func:`load_tokenizer` reads a ``tokenizer.json`` of the ``tokenizers`` library or a local ``transformers``
tokenizer directory. ``data.tokenizer=train`` (``data=jsonl_instructions``, ``jsonl_classification`` and
``text_corpus``) trains one instead, with :class:`TokenizerTraining`, on the texts of the training split only (the
readers hand over those texts; the test rows never reach the trainer):

* ``data.tokenizer_kind=bpe``: byte-level BPE (GPT-2's scheme: every byte is a token to start from, so no text is
  ever unknown; the merges are learnt up to ``data.vocab_size`` ids, which must leave room for the 256 bytes and
  the 3 special tokens);
* ``data.tokenizer_kind=word``: one id per word (split at whitespace and punctuation), the ``data.vocab_size - 3``
  most frequent words; any other word is ``<unk>``.

Ids 0, 1 and 2 are the special tokens ``<pad>``, ``<unk>`` and the end-of-sequence token (``data.eos_token``), so
padding is id 0 as for any ``tokenizer.json`` (``model.pad_token_id=0``). The vocabulary can come out smaller than
``data.vocab_size`` (a word-level vocabulary of fewer distinct words, BPE running out of pairs to merge); the data's
vocabulary, and so the model's, is the trained tokenizer's own size.

Training is deterministic: it reads the texts in the order given (the files' order), and the ``tokenizers``
trainers break ties in counts by the tokens themselves, not by hash order or thread timing (checked: the same
``tokenizer.json``, byte for byte, from fresh interpreters with 1 and 2 threads, on texts of tied counts;
``tests/llm/test_trained_tokenizer.py``). Nothing in it is random, so it does not depend on the run seed either.
The command line saves the tokenizer as ``<run dir>/tokenizer.json`` and a resumed run loads that file instead of
training again (:mod:`fedsim.cli.run`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsim.core.checkpoint import write_text_atomic
from fedsim.core.checks import integer
from fedsim.core.extras import require

TRAIN = "train"
"""The ``data.tokenizer`` value that trains a tokenizer on the training split."""

KINDS = ("bpe", "word")
"""What ``data.tokenizer_kind`` takes."""

PAD, UNK = "<pad>", "<unk>"
"""The special tokens of a trained tokenizer besides the end-of-sequence token: ids 0 and 1."""

BYTES = 256
"""The initial alphabet of byte-level BPE."""


@dataclass(frozen=True)
class Tokenizer:
    """What the loader needs of a tokenizer: ``encode`` (text to ids, no special tokens), the vocabulary size, the
    pad id (any id: padded positions are never scored) and the end-of-sequence id (None: none is appended)."""

    encode: Callable[[str], list[int]]
    vocab_size: int
    pad_id: int
    eos_id: int | None


def of_library(raw: Any, eos_token: str) -> Tokenizer:
    """The :class:`Tokenizer` of a ``tokenizers.Tokenizer``: pad id 0, ``eos_token``'s id (None when the vocabulary
    lacks it)."""
    eos = raw.token_to_id(eos_token)
    return Tokenizer(lambda text: list(raw.encode(text, add_special_tokens=False).ids), raw.get_vocab_size(), 0, eos)


def load_tokenizer(path: str, eos_token: str = "<|endoftext|>") -> Tokenizer:
    """A tokenizer from ``path``: a ``tokenizer.json`` file of the ``tokenizers`` library, or a local directory a
    ``transformers`` ``AutoTokenizer`` reads (``local_files_only``). For a ``tokenizer.json``, ``eos_token`` names
    the end-of-sequence token (not appended when the vocabulary lacks it)."""
    where = Path(path).expanduser()
    if where.is_file():
        tokenizers = require("tokenizers", "data=jsonl_instructions", "llm")
        return of_library(tokenizers.Tokenizer.from_file(str(where)), eos_token)
    if not where.is_dir():
        trains = " (data.tokenizer=train is for jsonl_instructions, jsonl_classification and text_corpus)"
        raise FileNotFoundError(
            f"data.tokenizer={path} is neither a tokenizer.json file nor a tokenizer directory"
            + (trains if path == TRAIN else "")
        )
    transformers = require("transformers", "data=jsonl_instructions", "llm")
    try:
        auto = transformers.AutoTokenizer.from_pretrained(where, local_files_only=True)
    except (OSError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise FileNotFoundError(f"data.tokenizer={path} holds no readable tokenizer ({first})") from None
    pad = auto.pad_token_id if auto.pad_token_id is not None else 0
    return Tokenizer(lambda text: list(auto.encode(text, add_special_tokens=False)), len(auto), pad, auto.eos_token_id)


@dataclass(frozen=True)
class TokenizerTraining:
    """How ``data.tokenizer=train`` trains (see the module's docstring): ``kind`` (``bpe`` or ``word``), the largest
    ``vocab_size`` (special tokens included) and ``save_to``, the ``tokenizer.json`` it writes (None: kept in
    memory). Checked when made, before any file is read."""

    kind: str = "bpe"
    vocab_size: int = 8000
    save_to: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"data.tokenizer_kind must be one of {', '.join(KINDS)} (got {self.kind!r})")
        lowest = BYTES + 3 if self.kind == "bpe" else 4
        hint = ": 256 bytes and 3 special tokens" if self.kind == "bpe" else ": 3 special tokens and a word"
        integer("data.vocab_size", self.vocab_size, lowest, hint=f" for data.tokenizer_kind={self.kind}{hint}")

    def train(self, texts: Iterable[str], eos_token: str) -> Tokenizer:
        """A tokenizer trained on ``texts`` (the training split's, in its order), saved to ``save_to`` when set."""
        tokenizers = require("tokenizers", "data.tokenizer=train", "llm")
        specials = [PAD, UNK, eos_token]
        if self.kind == "bpe":
            raw = tokenizers.Tokenizer(tokenizers.models.BPE())
            raw.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
            raw.decoder = tokenizers.decoders.ByteLevel()
            trainer = tokenizers.trainers.BpeTrainer(
                vocab_size=self.vocab_size,
                special_tokens=specials,
                initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
                show_progress=False,
            )
        else:
            raw = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token=UNK))
            raw.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
            trainer = tokenizers.trainers.WordLevelTrainer(
                vocab_size=self.vocab_size, special_tokens=specials, show_progress=False
            )
        raw.train_from_iterator(texts, trainer)
        if self.save_to is not None:
            write_text_atomic(Path(self.save_to), raw.to_str(pretty=True))
        return of_library(raw, eos_token)


def tokenizer_for(
    name: str | None, eos_token: str, training: TokenizerTraining, texts: Callable[[], Iterable[str]]
) -> Tokenizer:
    """``data.tokenizer=name`` as the readers use it: trained on ``texts()`` (the training split's texts) when
    ``name`` is :data:`TRAIN`, else :func:`load_tokenizer`."""
    if name == TRAIN:
        return training.train(texts(), eos_token)
    assert name is not None  # text_corpus handles None (LEAF's characters) itself
    return load_tokenizer(name, eos_token)
