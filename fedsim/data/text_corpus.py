"""Plain text as causal language-model data: any local corpus (``data=text_corpus``) and LEAF's Shakespeare
(``data=shakespeare_lm``).

A corpus is a list of documents. Each is tokenised once, with the run's tokenizer
(:func:`fedsim.data.tokenizer.load_tokenizer`) or, with ``tokenizer=null``, LEAF's character vocabulary
(:func:`character_tokenizer`: no file needed), and cut into windows of ``seq_len`` positions by :func:`windows`:
window ``k`` reads tokens ``k*L .. k*L+L-1`` and its label at every position is the next token. Windows do not
overlap and never cross a document; a document's last window is padded on the right (the pad id in ``x``, -100 in
the labels). ``num_classes`` is the vocabulary size; every row's group is its document (its speaking role for
Shakespeare), so ``partition=natural`` makes one client per document.

Test rows come from each document's own text (the layout of :class:`~fedsim.data.tensor_data.DataSplit`'s
``local_test``): under ``partition=natural`` a client tests on its own held-out windows, and the centralized test set
is all of them. Any other partitioner divides the training windows only.

* :func:`text_corpus`: a ``.txt`` file or a folder of them (every ``*.txt`` below it, sorted by path). A document is
  a whole file (``document=file``) or a paragraph, the text between blank lines (``document=paragraph``); an
  end-of-sequence token closes each document when the tokenizer has one. The last ``test_fraction`` of each
  document's windows (rounded, at least one left for training) are its test windows; or ``test_path`` names other
  files as the centralized test set. With ``tokenizer="train"`` (:class:`fedsim.data.tokenizer.TokenizerTraining`)
  the tokenizer learns from the training text alone: without ``test_path``, each document is held out by characters
  instead (its last ``test_fraction`` of characters, rounded, at least one left for training, are its test text),
  the tokenizer is trained on the training parts, and each part is cut into windows on its own; with ``test_path``
  it is trained on every document of ``path``.
* :func:`shakespeare_lm`: LEAF's Shakespeare JSON (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018;
  read by :mod:`fedsim.data.leaf`), whose examples are 80-character windows sliding by one character over each
  role's lines. The role's text is rebuilt from them (an example whose window continues the text so far adds its
  next character; any other starts a new piece), separately for LEAF's train and test files, so LEAF's own split is
  kept, and each piece is cut into windows as above (about 80 times fewer rows than LEAF's overlapping examples).
  Test windows of a role that has no training window are dropped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fedsim.core.checks import integer, within
from fedsim.data import leaf, text
from fedsim.data.instructions import IGNORE
from fedsim.data.reading import read_utf8
from fedsim.data.tensor_data import DataSplit, TensorData, pooled_split
from fedsim.data.tokenizer import TRAIN, Tokenizer, TokenizerTraining, load_tokenizer, tokenizer_for

DOCUMENTS = ("file", "paragraph")
"""What one document of :func:`text_corpus` is."""

Piece = tuple[np.ndarray, np.ndarray]
"""``(x, labels)`` windows of one document, each ``[n, seq_len]``."""


def character_tokenizer() -> Tokenizer:
    """LEAF's character vocabulary as a tokenizer: ids from :func:`fedsim.data.text.encode_characters` (80
    characters, any other id 80, so 81 ids), no end-of-sequence token, the space as padding."""
    return Tokenizer(
        lambda s: text.encode_characters([s], len(s))[0].tolist(),
        text.NUM_CHARACTER_IDS,
        text.LEAF_CHARACTERS.index(" "),
        None,
    )


def corpus_tokenizer(tokenizer: str | None, eos_token: str) -> Tokenizer:
    """:func:`character_tokenizer` for ``None``, else :func:`fedsim.data.tokenizer.load_tokenizer`."""
    return character_tokenizer() if tokenizer is None else load_tokenizer(tokenizer, eos_token)


def windows(ids: Sequence[int], seq_len: int, pad_id: int) -> Piece:
    """Next-token windows of one document's ``ids`` (see the module's docstring): ``ceil((len(ids) - 1) / seq_len)``
    rows; position ``p`` of the flattened rows reads token ``p`` and is labelled with token ``p + 1``."""
    tokens = np.asarray(ids, dtype=np.int64)
    scored = max(len(tokens) - 1, 0)
    rows = -(-scored // seq_len)
    x = np.full((rows, seq_len), pad_id, dtype=np.int64)
    y = np.full((rows, seq_len), IGNORE, dtype=np.int64)
    x.reshape(-1)[:scored] = tokens[:scored]
    y.reshape(-1)[:scored] = tokens[1 : scored + 1]
    return x, y


def _text_files(path: str, key: str) -> list[Path]:
    """The ``.txt`` file ``path``, or every ``*.txt`` under the folder ``path`` (sorted)."""
    where = Path(path).expanduser()
    if where.is_file():
        return [where]
    if not where.is_dir():
        raise FileNotFoundError(f"{key}={path} does not exist; point it at a local .txt file or a folder of them")
    files = sorted(p for p in where.rglob("*.txt") if p.is_file())
    if not files:
        raise FileNotFoundError(f"{key}={path} holds no .txt files; point it at a .txt file or a folder of them")
    return files


def read_text(path: Path) -> str:
    """The whole UTF-8 file ``path``; one line naming the file when it cannot be read or is empty, and the file and
    the line when it is not UTF-8 (:func:`fedsim.data.reading.read_utf8`)."""
    try:
        content = read_utf8(path)
    except OSError as error:
        raise FileNotFoundError(f"data: cannot read {path} ({error.strerror or error}); check the file") from None
    if not content.strip():
        raise ValueError(f"data: {path} is empty; remove it from the corpus or give it some text")
    return content


def read_documents(path: str, document: str, key: str = "data.path") -> list[str]:
    """The documents of the file or folder ``path``: whole files, or their paragraphs (text between blank lines)."""
    if document not in DOCUMENTS:
        raise ValueError(f"data.document must be one of {', '.join(DOCUMENTS)} (got {document!r})")
    texts = [read_text(file) for file in _text_files(path, key)]
    if document == "file":
        return texts
    return [block.strip() for t in texts for block in re.split(r"\n[ \t\r\f\v]*\n", t) if block.strip()]


def _stack(pieces: list[Piece], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pieces' windows one after the other, as two ``[n, seq_len]`` tensors."""
    if not pieces:
        return torch.zeros(0, seq_len, dtype=torch.int64), torch.zeros(0, seq_len, dtype=torch.int64)
    return torch.from_numpy(np.concatenate([p[0] for p in pieces])), torch.from_numpy(
        np.concatenate([p[1] for p in pieces])
    )


def pooled_windows(
    owners: Sequence[object], train: list[Piece], test: list[Piece], vocab: int, seq_len: int
) -> DataSplit:
    """Every owner's training windows, then every owner's test windows (``train[i]`` and ``test[i]`` are
    ``owners[i]``'s), in one tensor: :func:`~fedsim.data.tensor_data.pooled_split`'s layout, ``local_test`` marking
    the test rows and ``test`` a view of them. :mod:`fedsim.data.synthetic_text` builds its split with it too."""
    x, y = _stack(train + test, seq_len)
    groups = np.repeat(np.asarray(list(owners) * 2), [len(p[0]) for p in train + test])
    return pooled_split(x, y, vocab, groups, sum(len(p[0]) for p in train))


def held_out(piece: Piece, fraction: float) -> tuple[Piece, Piece]:
    """The piece's windows split into (train, test): the last ``round(n * fraction)`` are test, at least one train
    (an empty piece gives two empty ones)."""
    n = len(piece[0])
    cut = n - min(int(round(n * fraction)), n - 1) if n else 0
    return (piece[0][:cut], piece[1][:cut]), (piece[0][cut:], piece[1][cut:])


def held_out_text(text: str, fraction: float) -> tuple[str, str]:
    """The document ``text`` split at a character into (train, test): the last ``round(n * fraction)`` of its ``n``
    characters are test, at least one is train."""
    cut = len(text) - min(int(round(len(text) * fraction)), len(text) - 1)
    return text[:cut], text[cut:]


def _trained_split(
    docs: list[str], training: TokenizerTraining, eos_token: str, seq_len: int, fraction: float
) -> tuple[list[Piece], list[Piece], Tokenizer]:
    """Each document's training and test windows, cut from its two parts of :func:`held_out_text`, and the tokenizer
    trained on the training parts alone (``data.tokenizer=train`` without ``test_path``)."""
    halves = [held_out_text(d, fraction) for d in docs]
    tok = training.train((train for train, _ in halves), eos_token)
    eos = [tok.eos_id] if tok.eos_id is not None else []
    train = [windows(tok.encode(part), seq_len, tok.pad_id) for part, _ in halves]
    return train, [windows(tok.encode(part) + eos, seq_len, tok.pad_id) for _, part in halves], tok


def text_corpus(
    *,
    path: str,
    tokenizer: str | None = None,
    seq_len: int = 128,
    document: str = "file",
    test_path: str | None = None,
    test_fraction: float = 0.1,
    eos_token: str = "<|endoftext|>",
    tokenizer_kind: str = "bpe",
    vocab_size: int = 8000,
    tokenizer_file: str | None = None,
) -> DataSplit:
    """The text corpus ``path`` (a ``.txt`` file or a folder of them) as next-token windows; see the module's
    docstring. ``tokenizer``: a ``tokenizer.json`` or local ``transformers`` tokenizer directory, ``None`` for
    LEAF's characters, or ``"train"`` for one trained on the training text alone (``tokenizer_kind``,
    ``vocab_size`` and ``tokenizer_file`` as :class:`~fedsim.data.tokenizer.TokenizerTraining`; without
    ``test_path`` each document is then held out by characters, see the module's docstring). ``test_path`` (files
    or a folder, whole files are documents) replaces the per-document test windows with a centralized test set."""
    integer("data.seq_len", seq_len, 1)
    within("data.test_fraction", test_fraction, "[0, 1)")
    training = TokenizerTraining(tokenizer_kind, vocab_size, tokenizer_file)
    docs = read_documents(path, document)
    test_docs = read_documents(test_path, "file", "data.test_path") if test_path is not None else []
    if tokenizer == TRAIN and test_path is None:
        train, test, tok = _trained_split(docs, training, eos_token, seq_len, test_fraction)
        _some_window(train, path)
        return pooled_windows(range(len(docs)), train, test, tok.vocab_size, seq_len)
    tok = character_tokenizer() if tokenizer is None else tokenizer_for(tokenizer, eos_token, training, lambda: docs)
    eos = [tok.eos_id] if tok.eos_id is not None else []
    pieces = [windows(tok.encode(d) + eos, seq_len, tok.pad_id) for d in docs]
    _some_window(pieces, path)
    if test_path is None:
        train, test = (list(half) for half in zip(*(held_out(p, test_fraction) for p in pieces), strict=True))
        return pooled_windows(range(len(docs)), train, test, tok.vocab_size, seq_len)
    x, y = _stack(pieces, seq_len)
    groups = np.repeat(np.arange(len(docs)), [len(p[0]) for p in pieces])
    test_x, test_y = _stack([windows(tok.encode(d) + eos, seq_len, tok.pad_id) for d in test_docs], seq_len)
    return DataSplit(TensorData(x, y, tok.vocab_size, groups), TensorData(test_x, test_y, tok.vocab_size))


def _some_window(pieces: list[Piece], path: str) -> None:
    """One line naming ``data.path`` when no document gave a training window."""
    if not any(len(p[0]) for p in pieces):
        raise ValueError(f"data.path={path} has no document of 2 or more tokens; give it more text")


def role_text(xs: list, ys: list, where: object) -> list[str]:
    """The pieces of text that one role's LEAF Shakespeare examples (``x`` windows, ``y`` next characters) slide
    over (see the module's docstring)."""
    pieces: list[str] = []
    current: list[str] = []
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if not isinstance(x, str) or not isinstance(y, str) or len(y) != 1:
            raise ValueError(
                f"data=shakespeare_lm: {where}, row {i}: x must be a string and y one character (got {y!r})"
            )
        if current and len(x) <= len(current) and "".join(current[len(current) - len(x) :]) == x:
            current.append(y)
            continue
        if current:
            pieces.append("".join(current))
        current = [*x, y]
    return pieces + (["".join(current)] if current else [])


def shakespeare_lm(
    *,
    root: str | Path,
    folder: str | Path | None = None,
    tokenizer: str | None = None,
    seq_len: int = 80,
    eos_token: str = "<|endoftext|>",
) -> DataSplit:
    """LEAF's Shakespeare as next-token windows, one client per speaking role, LEAF's own train/test split (see the
    module's docstring; the files are found as :func:`fedsim.data.leaf.shakespeare` finds them). ``tokenizer``:
    ``None`` for LEAF's characters, or the run's tokenizer (no end-of-sequence token is added)."""
    integer("data.seq_len", seq_len, 1)
    tok = corpus_tokenizer(tokenizer, eos_token)
    layout = leaf.read_layout("shakespeare", root, folder)
    texts: dict[bool, dict[str, list[str]]] = {False: {}, True: {}}

    def convert(xs: list, ys: list, start: int, where: leaf.Where) -> None:
        texts[start >= layout.n_train][where.user] = role_text(xs, ys, where)

    layout.fill(convert)

    def piece(pieces: list[str]) -> Piece:
        parts = [windows(tok.encode(p), seq_len, tok.pad_id) for p in pieces] or [windows([], seq_len, tok.pad_id)]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    train = {user: piece(pieces) for user, pieces in sorted(texts[False].items())}
    users = [user for user, p in train.items() if len(p[0])]
    if not users:
        raise ValueError("data=shakespeare_lm: no role has a training window (2 or more tokens); check the LEAF files")
    test = [piece(texts[True].get(user, [])) for user in users]
    return pooled_windows(users, [train[u] for u in users], test, tok.vocab_size, seq_len)
