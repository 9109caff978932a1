"""Sequence models for the LEAF text tasks (Caldas et al. 2018, "LEAF: A Benchmark for Federated Settings",
https://github.com/TalwalkarLab/leaf, ``models/shakespeare`` and ``models/sent140``).

* :class:`CharLSTM` — next-character prediction on Shakespeare, the character LSTM of McMahan et al. 2017,
  "Communication-Efficient Learning of Deep Networks from Decentralized Data" (AISTATS), Section 3: an 8-dim
  character embedding, two LSTM layers of 256 units and a dense layer over the characters, read at the last
  position of an 80-character window (LEAF's ``shakespeare/stacked_lstm.py``).
* :class:`SentimentLSTM` — Sent140 sentiment, LEAF's ``sent140/stacked_lstm.py``: word embedding, two LSTM
  layers of 100 units, a linear layer of 128 units and a dense output, read at each tweet's LAST WORD (LEAF reads
  the last position, padding included; here padding never changes the output).
* :class:`BagOfWords` — the mean of a tweet's word embeddings, then a linear layer: the low-rank form of
  LEAF's bag-of-words logistic regression (``sent140/bag_log_reg.py``), a neural bag-of-words.

Inputs are int64 token ids ``(B, L)``: 0 is padding (at the end of a row), 1 an unknown word. Sent140 models
may start from GloVe vectors (Pennington, Socher, Manning 2014, https://nlp.stanford.edu/projects/glove/): a text
file of lines ``word v1 v2 ... vd``; the word on line ``i`` (from 0) has id ``i + 2``.

Every executor runs these models. ``executor=vmap`` gives the serial results up to float rounding, but PyTorch has
no batched LSTM kernel for ``torch.func.vmap`` (it warns "There is a performance drop ... mkldnn_rnn_layer" and
loops over the clients of a chunk), so for the LSTMs it is no faster than ``executor=serial``: prefer
``executor=process``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

GLOVE_SOURCE = "https://nlp.stanford.edu/projects/glove/ (e.g. glove.6B.300d.txt, as LEAF uses)"
RESERVED_IDS = 2  # 0: padding, 1: unknown word


def require_sequence_shape(input_shape: tuple[int, ...], model_name: str) -> int:
    """The sequence length of ``input_shape`` ``(L,)``, or ValueError naming the config ``model_name``."""
    if len(input_shape) != 1 or int(input_shape[0]) < 1:
        raise ValueError(
            f"model={model_name} needs rows of token ids, input_shape (L,), but the data gives {tuple(input_shape)}; "
            "use a text data option (e.g. data=shakespeare or data=sent140) or an image/vector model"
        )
    return int(input_shape[0])


def _require_token_ids(x: torch.Tensor, model_name: str) -> None:
    """Refuse float features (a static check on the dtype: it costs nothing and works under vmap)."""
    if x.is_floating_point():
        raise ValueError(
            f"model={model_name} reads int64 token ids but got {x.dtype} features; "
            "give integer arrays (DataSplit.from_arrays keeps them as int64 ids)"
        )


def last_token_index(x: torch.Tensor) -> torch.Tensor:
    """``(B, L)`` ids → ``(B,)`` position of each row's last non-padding token (0 for a row of padding only)."""
    positions = torch.arange(1, x.shape[-1] + 1, device=x.device)
    return ((x != 0) * positions).amax(dim=-1).sub(1).clamp(min=0)


def read_glove(path: str | Path, max_words: int | None = None) -> torch.Tensor:
    """A GloVe text file as a float32 embedding matrix ``(RESERVED_IDS + words, d)``: row ``i + 2`` is line ``i``,
    rows 0 (padding) and 1 (unknown word) are zero, as LEAF's ``get_embs.py`` gives unknown words a zero vector.

    ``d`` is the first line's number of values. Only the first ``max_words`` lines are read (GloVe files list
    words by frequency). A word may contain spaces (glove.840B has a few): the last ``d`` fields are the vector.
    """
    where = os.path.expanduser(str(path))
    if not os.path.isfile(where):
        raise FileNotFoundError(
            f"model: no GloVe file {where}; download one from {GLOVE_SOURCE}, unzip it and set "
            "model.glove to the .txt file, or model.glove=null to learn the embedding"
        )
    rows: list[np.ndarray] = []
    dim = 0
    with open(where, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if max_words is not None and len(rows) >= max_words:
                break
            fields = line.rstrip("\n").rstrip(" ").split(" ")
            dim = dim or len(fields) - 1
            rows.append(_glove_vector(fields, dim, where, number))
    if not rows or dim < 1:
        raise ValueError(f"model: GloVe file {where} has no vectors; each line must be 'word v1 v2 ... vd'")
    return torch.from_numpy(np.concatenate([np.zeros((RESERVED_IDS, dim), dtype=np.float32), np.stack(rows)]))


def _glove_vector(fields: list[str], dim: int, where: str, number: int) -> np.ndarray:
    """The last ``dim`` fields of one line as float32; ValueError naming the file and line otherwise."""
    if len(fields) < dim + 1 or not fields[0]:
        raise ValueError(
            f"model: GloVe file {where} line {number} has {len(fields) - 1} values after the word, "
            f"line 1 has {dim}; every line must be 'word' and {dim} numbers separated by spaces"
        )
    try:
        return np.asarray(fields[-dim:], dtype=np.float32)
    except ValueError:
        raise ValueError(
            f"model: GloVe file {where} line {number} has a value that is not a number; each line must "
            "be 'word v1 v2 ... vd'"
        ) from None


class TokenEmbedding(nn.Module):
    """Token ids → vectors; row 0 (padding) gets no gradient.

    Learned (``vocab_size`` × ``dim``, PyTorch's N(0, 1) initialisation) without ``glove``. With ``glove`` the
    rows come from the file (see :func:`read_glove`); ``freeze=True`` (LEAF's choice for GloVe: fixed
    vectors) keeps them in a non-persistent buffer, outside ``state_dict``: they are neither trained nor
    federated (every worker builds its model from the same file, so the path must be readable on every machine of a
    Ray cluster), and updates stay as small as the rest of the model. ``freeze=False`` fine-tunes them as a
    federated parameter. With ``glove``, ``vocab_size`` reads the file's first ``vocab_size - 2`` words (a file
    with fewer is refused); ``None`` reads it all.
    """

    frozen: torch.Tensor  # the GloVe vectors with freeze=True (a buffer; absent otherwise)

    def __init__(
        self, vocab_size: int | None, dim: int, model_name: str, glove: str | Path | None = None, freeze: bool = True
    ) -> None:
        super().__init__()
        if glove is None:
            if vocab_size is None or vocab_size <= RESERVED_IDS:
                raise ValueError(
                    f"model={model_name}: vocab_size must be > {RESERVED_IDS} (ids 0 and 1 are padding "
                    f"and unknown), got {vocab_size}; set model.vocab_size to the data's vocabulary size"
                )
            self.weight = nn.Parameter(torch.randn(vocab_size, dim))
            with torch.no_grad():
                self.weight[0].zero_()
            return
        vectors = read_glove(glove, None if vocab_size is None else vocab_size - RESERVED_IDS)
        if vocab_size is not None and vectors.shape[0] != vocab_size:
            raise ValueError(
                f"model={model_name}: GloVe file {glove} has {vectors.shape[0] - RESERVED_IDS} words but "
                f"vocab_size is {vocab_size} ({vocab_size - RESERVED_IDS} words + padding + unknown); set "
                f"model.vocab_size={vectors.shape[0]} (or null) to match the data's vocabulary"
            )
        if freeze:
            self.register_buffer("frozen", vectors, persistent=False)
        else:
            self.weight = nn.Parameter(vectors)

    @property
    def table(self) -> torch.Tensor:
        """The ``(vocab_size, dim)`` matrix in use."""
        return self.frozen if hasattr(self, "frozen") else self.weight

    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, L)`` ids → ``(B, L, dim)``."""
        return F.embedding(x, self.table, padding_idx=0)


class CharLSTM(nn.Module):
    """McMahan et al. 2017's Shakespeare model: embedding(``embed_dim``=8) → ``num_layers``=2 × LSTM(``hidden``=256)
    → dense ``num_classes``, applied to the output at the last position; returns logits ``(B, num_classes)``.

    ``vocab_size`` (the input alphabet) defaults to ``num_classes``, as in LEAF where both are its 80 characters
    (81 when the reader adds an unknown symbol). A window is never padded, so no masking is needed.
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        vocab_size: int | None = None,
        embed_dim: int = 8,
        hidden: int = 256,
        num_layers: int = 2,
    ) -> None:
        super().__init__()
        require_sequence_shape(input_shape, "char_lstm")
        self.embedding = nn.Embedding(vocab_size or num_classes, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=num_layers, batch_first=True)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, L)`` character ids → logits ``(B, num_classes)`` for the character after the window."""
        _require_token_ids(x, "char_lstm")
        out, _ = self.lstm(self.embedding(x))
        return self.fc(out[:, -1])


class SentimentLSTM(nn.Module):
    """LEAF's Sent140 LSTM: embedding → 2 × LSTM(``hidden``=100) → linear(``fc_units``=128, no activation, as in
    LEAF) → dense ``num_classes``; returns logits ``(B, num_classes)``.

    The output is read at each row's last non-padding token (a left-to-right LSTM there has not seen the padding
    after it), so padding at the end of a row does not change the logits. ``embed_dim`` (default 100, LEAF's
    learned embedding) is the file's dimension when ``glove`` is given; see :class:`TokenEmbedding` for
    ``vocab_size`` and ``freeze_embedding``.
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        vocab_size: int | None = None,
        glove: str | Path | None = None,
        freeze_embedding: bool = True,
        embed_dim: int = 100,
        hidden: int = 100,
        num_layers: int = 2,
        fc_units: int = 128,
    ) -> None:
        super().__init__()
        require_sequence_shape(input_shape, "sent_lstm")
        self.embedding = TokenEmbedding(vocab_size, embed_dim, "sent_lstm", glove, freeze_embedding)
        self.lstm = nn.LSTM(self.embedding.dim, hidden, num_layers=num_layers, batch_first=True)
        self.fc1 = nn.Linear(hidden, fc_units)
        self.fc2 = nn.Linear(fc_units, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, L)`` word ids, padded with 0 at the end → logits ``(B, num_classes)``."""
        _require_token_ids(x, "sent_lstm")
        out, _ = self.lstm(self.embedding(x))
        last = last_token_index(x).view(-1, 1, 1).expand(-1, 1, out.shape[-1])
        return self.fc2(self.fc1(out.gather(1, last).squeeze(1)))


class BagOfWords(nn.Module):
    """Mean of the non-padding word embeddings → linear ``num_classes``; returns logits ``(B, num_classes)``.

    Padding at the end of a row does not change the logits, bit for bit (the sum is read at the last word). A row of
    padding only gives the zero vector (logits = the bias). ``embed_dim`` (default 100) is the file's
    dimension when ``glove`` is given; see :class:`TokenEmbedding` for ``vocab_size`` and ``freeze_embedding``.
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        vocab_size: int | None = None,
        glove: str | Path | None = None,
        freeze_embedding: bool = True,
        embed_dim: int = 100,
    ) -> None:
        super().__init__()
        require_sequence_shape(input_shape, "bag_of_words")
        self.embedding = TokenEmbedding(vocab_size, embed_dim, "bag_of_words", glove, freeze_embedding)
        self.fc = nn.Linear(self.embedding.dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, L)`` word ids, 0 = padding → logits ``(B, num_classes)``."""
        _require_token_ids(x, "bag_of_words")
        mask = (x != 0).unsqueeze(-1).to(self.fc.weight.dtype)
        # a running sum read at the last word: the padding after it cannot change the rounding (it could in .sum())
        running = (self.embedding(x) * mask).cumsum(dim=1)
        last = last_token_index(x).view(-1, 1, 1).expand(-1, 1, running.shape[-1])
        return self.fc(running.gather(1, last).squeeze(1) / mask.sum(dim=1).clamp(min=1))
