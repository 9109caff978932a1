"""Text encodings of the LEAF text tasks (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018,
https://github.com/TalwalkarLab/leaf, ``models/utils/language_utils.py``).

Characters (Shakespeare next-character prediction):

* :data:`LEAF_CHARACTERS` is LEAF's 80-letter alphabet ``ALL_LETTERS``; character ``c`` has the id
  ``LEAF_CHARACTERS.index(c)``, as LEAF's ``letter_to_index``.
* Any other character (LEAF's ``find`` would give -1) becomes :data:`UNKNOWN_CHARACTER` = 80, one id past the
  alphabet, so a model's vocabulary and its output layer need :data:`NUM_CHARACTER_IDS` = 81 entries.
* :func:`encode_characters` turns strings into rows of ``length`` ids. A longer string keeps its LAST ``length``
  characters (the context nearest the character to predict); a shorter one is padded at the START with the id of
  a space, so the real characters stay at the end, where a left-to-right model reads its output.

Words (Sent140 sentiment):

* :func:`tokenise`: lower-case, then LEAF's ``split_line`` pattern ``[\\w']+|[.,!?;]``: runs of letters, digits,
  ``_`` and ``'`` are words, each of ``. , ! ? ;`` is a word of its own, everything else (spaces, other
  punctuation, ``@``, ``#``, emoji) separates words. Lower-casing matches GloVe's lower-case vocabularies (LEAF
  does not lower-case, so its capitalised words are all unknown to GloVe).
* Word ids: 0 is padding (at the END of a row), 1 an unknown word, real words from 2 on (:data:`RESERVED_IDS`).
  A vocabulary is :func:`most_frequent_words` of the training texts, or the words of a GloVe file in file order
  (:func:`read_glove_words`; line ``i`` from 0 has id ``i + 2``, the row :func:`fedsim.models.text.read_glove`
  gives that word's vector). :func:`encode_words` keeps a text's first ``max_words`` words (LEAF's
  ``line_to_indices``; LEAF pads with the unknown id, here padding is 0 so models can mask it).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from fedsim.data.reading import not_utf8

LEAF_CHARACTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
"""LEAF's ``ALL_LETTERS``: the character with id ``i`` is ``LEAF_CHARACTERS[i]``."""

UNKNOWN_CHARACTER = len(LEAF_CHARACTERS)
"""The id of every character outside :data:`LEAF_CHARACTERS` (80)."""

NUM_CHARACTER_IDS = UNKNOWN_CHARACTER + 1
"""How many character ids there are, the unknown one included (81): Shakespeare's ``num_classes``."""

PAD_WORD, UNKNOWN_WORD = 0, 1
RESERVED_IDS = 2
"""Word ids below this are padding (0) and unknown (1); real words start here."""

GLOVE_SOURCE = "https://nlp.stanford.edu/projects/glove/ (e.g. glove.6B.300d.txt, as LEAF uses)"

_WORD = re.compile(r"[\w']+|[.,!?;]")
_ASCII_IDS = np.full(128, UNKNOWN_CHARACTER, dtype=np.int64)
_ASCII_IDS[[ord(c) for c in LEAF_CHARACTERS]] = np.arange(len(LEAF_CHARACTERS))
_SPACE = LEAF_CHARACTERS.index(" ")


def _code_points(texts: Sequence[str], what: str) -> np.ndarray:
    """``texts`` as a contiguous 1-D fixed-width unicode array; a one-line ValueError for an item that is not a
    ``str``."""
    if not (isinstance(texts, np.ndarray) and texts.dtype.kind == "U"):
        texts = list(texts)
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise ValueError(f"text: {what} must be strings; item {bad} is {type(texts[bad]).__name__} {texts[bad]!r}")
    return np.ascontiguousarray(np.asarray(texts, dtype=str).reshape(-1))


def _ids_of(codes: np.ndarray) -> np.ndarray:
    """Unicode code points (any shape) → LEAF character ids; non-ASCII ones are unknown."""
    return np.where(codes < 128, _ASCII_IDS[np.minimum(codes, 127)], UNKNOWN_CHARACTER)


def encode_characters(texts: Sequence[str], length: int | None = None) -> np.ndarray:
    """Strings → int64 ``(N, length)`` LEAF character ids (see the module docstring for cutting and padding).

    ``length`` defaults to the longest string. Vectorised: the strings' UTF-32 code points go through a lookup
    table, with no Python loop over characters.
    """
    arr = _code_points(texts, "texts to encode")
    lengths = np.char.str_len(arr) if arr.size else np.zeros(0, dtype=np.int64)
    width = int(lengths.max(initial=0)) if length is None else int(length)
    if width < 0:
        raise ValueError(f"text: length must be >= 0, got {length}")
    if arr.size == 0 or width == 0:
        return np.zeros((arr.size, width), dtype=np.int64)
    codes = arr.view(np.uint32).reshape(arr.size, -1)  # padded with code 0 after each string
    start = lengths[:, None] - width + np.arange(width)[None, :]  # source position of every output column
    picked = np.take_along_axis(codes, np.clip(start, 0, codes.shape[1] - 1), axis=1)
    return np.where(start >= 0, _ids_of(picked), _SPACE).astype(np.int64)


def character_ids(chars: Sequence[str]) -> np.ndarray:
    """Single characters (e.g. Shakespeare's next-character labels) → int64 ``(N,)`` LEAF ids.

    Raises a one-line ValueError naming the first item that is not a string of exactly one character.
    """
    arr = _code_points(chars, "characters")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    lengths = np.char.str_len(arr)
    if (lengths != 1).any():
        bad = int(np.flatnonzero(lengths != 1)[0])
        raise ValueError(f"text: item {bad} is {str(arr[bad])!r}, not a single character")
    return _ids_of(arr.view(np.uint32).reshape(arr.size, -1)[:, 0]).astype(np.int64)


def tokenise(text: str) -> list[str]:
    """The words of ``text`` (lower-cased LEAF ``split_line``; see the module docstring)."""
    return _WORD.findall(text.lower())


def most_frequent_words(texts: Iterable[str], vocab_size: int | None) -> dict[str, int]:
    """Word → id (from 2) for the ``vocab_size - 2`` most frequent words of ``texts`` (every word for ``None``).

    ``vocab_size`` counts the padding and unknown ids, as a model's embedding does. Ties are broken by the word
    itself (alphabetical), so the vocabulary depends on the texts only, not on their order.
    """
    if vocab_size is not None and vocab_size < RESERVED_IDS:
        raise ValueError(
            f"text: vocab_size must be >= {RESERVED_IDS} (ids 0 and 1 are padding and unknown), got {vocab_size}"
        )
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(tokenise(text))
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    ranked = ranked if vocab_size is None else ranked[: vocab_size - RESERVED_IDS]
    return {word: i + RESERVED_IDS for i, (word, _) in enumerate(ranked)}


def read_glove_words(path: str | Path, max_words: int | None = None) -> dict[str, int]:
    """Word → id of a GloVe text file (lines ``word v1 ... vd``): line ``i`` (from 0) has id ``i + 2``.

    Only the words are kept (the vectors are skipped). ``d`` is the first line's number of values; a word may
    contain spaces (glove.840B has a few): everything before the last ``d`` fields is the word. A word listed
    twice keeps its first line. ``max_words`` reads only the first lines, as
    :func:`fedsim.models.text.read_glove` does.
    """
    where = os.path.expanduser(str(path))
    if not os.path.isfile(where):
        raise FileNotFoundError(
            f"data: no GloVe file {where}; download one from {GLOVE_SOURCE}, unzip it and set "
            "data.glove to the .txt file, or data.glove=null to build the vocabulary from the tweets"
        )
    words: dict[str, int] = {}
    dim = 0
    with open(where, "rb") as lines:
        for number, raw in enumerate(lines):
            if max_words is not None and number >= max_words:
                break
            try:
                line = raw.decode("utf-8").rstrip("\r\n").rstrip(" ")  # as text mode read "\r\n" endings
            except UnicodeDecodeError as error:
                raise not_utf8(error, where, number + 1) from None
            spaces = line.count(" ")
            dim = dim or spaces
            if dim < 1 or spaces < dim:
                raise ValueError(
                    f"data: GloVe file {where} line {number + 1} has {spaces} values after the word, "
                    f"line 1 has {dim}; every line must be 'word v1 v2 ... vd'"
                )
            word = line[: line.index(" ")] if spaces == dim else line.rsplit(" ", dim)[0]
            words.setdefault(word, number + RESERVED_IDS)
    if not words:
        raise ValueError(f"data: GloVe file {where} is empty; each line must be 'word v1 v2 ... vd'")
    return words


def encode_words(texts: Iterable[str], vocabulary: Mapping[str, int], max_words: int) -> np.ndarray:
    """Texts → int64 ``(N, max_words)`` word ids: the first ``max_words`` words, unknown ones 1, padding 0 at the
    end."""
    texts = list(texts)
    out = np.zeros((len(texts), max_words), dtype=np.int64)
    for i, text in enumerate(texts):
        ids = [vocabulary.get(word, UNKNOWN_WORD) for word in tokenise(text)[:max_words]]
        out[i, : len(ids)] = ids
    return out
