"""Instruction data from local JSON Lines, tokenised once, for causal language models (``data=jsonl_instructions``).

Every line is one JSON object in the Alpaca layout: ``instruction``, ``input`` (may be empty or absent) and
``output``, plus optionally a user column (``partition=natural`` makes one client of each user) and a category
column (``data.category_column``: any JSON string, number or boolean; the sorted categories are ids 0, 1, ... that
``partition=dirichlet`` and ``shards`` split by, :attr:`TensorData.categories`). A row becomes the Alpaca prompt
(Taori et al., Stanford Alpaca, 2023)::

    ### Instruction:
    {instruction}

    ### Input:            (left out when input is empty)
    {input}

    ### Response:
    {output}<eos>

tokenised as ``prompt + response (+ eos)``. The example is next-token prediction: ``x`` is the tokens but the last,
the label at position ``i`` is token ``i + 1``, and every label that is a prompt token is -100 (the loss is on the
response only, the usual masking of instruction tuning). Each example has exactly ``seq_len`` positions: longer
ones are cut at the end (the response's tail is lost first), shorter ones padded on the right with the pad token in
``x`` and -100 in the labels. ``num_classes`` is the tokenizer's vocabulary size.

The tokenizer is a file or directory (:func:`fedsim.data.tokenizer.load_tokenizer`), or with ``tokenizer="train"``
one trained on the training rows alone (their prompts and responses; a classifier's texts), never on the test rows
(:class:`fedsim.data.tokenizer.TokenizerTraining`).

:func:`jsonl_classification` (``data=jsonl_classification``, for ``model=hf_seq_cls``) reads lines holding a text
and a label column instead: ``x`` is the text's first ``seq_len`` tokens (padded on the right), ``y`` one class id
per example. Labels are class ids (integers from 0; ``num_classes`` is the largest plus one) or class names (the
names of the training and test files together, sorted, are classes 0, 1, ...).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsim.core.checks import integer, within
from fedsim.data.reading import read_utf8
from fedsim.data.tensor_data import DataSplit, TensorData
from fedsim.data.tokenizer import Tokenizer, TokenizerTraining, tokenizer_for

IGNORE = -100
"""The label of a position that takes no loss (prompt and padding), PyTorch's ``ignore_index``."""


def prompt_of(row: dict[str, Any]) -> str:
    """The Alpaca prompt of ``row``, up to and including ``### Response:\\n``."""
    text = f"### Instruction:\n{row['instruction']}\n\n"
    if row.get("input"):
        text += f"### Input:\n{row['input']}\n\n"
    return text + "### Response:\n"


def encode_example(prompt: list[int], response: list[int], seq_len: int, pad_id: int) -> tuple[list[int], list[int]]:
    """``(x, labels)`` of one example, both ``seq_len`` long (see the module's docstring)."""
    tokens = (prompt + response)[: seq_len + 1]
    x = tokens[:-1]
    labels = [token if i + 1 >= len(prompt) else IGNORE for i, token in enumerate(tokens[1:])]
    padding = seq_len - len(x)
    return x + [pad_id] * padding, labels + [IGNORE] * padding


def read_rows(
    path: Path,
    user_column: str | None,
    fields: tuple[str, ...] = ("instruction", "output"),
    strings: int = 2,
    category_column: str | None = None,
) -> list[dict[str, Any]]:
    """The rows of the JSON Lines file ``path``, each holding ``fields`` (the first ``strings`` of them strings), the
    user column and the category column (a JSON string, finite number or boolean); a bad line is refused in one line
    naming the file and line."""
    if not path.is_file():
        raise FileNotFoundError(f"data: {path} does not exist; point data.path at a local JSON Lines file")
    rows = []
    for number, line in enumerate(read_utf8(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"data: {path} line {number} is not JSON ({error.msg})") from None
        needed = fields + tuple(c for c in (user_column, category_column) if c)
        missing = [k for k in needed if not isinstance(row, dict) or k not in row]
        if missing:
            raise ValueError(f"data: {path} line {number} has no {missing[0]!r} field")
        if not all(isinstance(row[k], str) for k in fields[:strings]):
            raise ValueError(f"data: {path} line {number}: {' and '.join(fields[:strings])} must be strings")
        if category_column and _category_key(row[category_column]) is None:
            raise ValueError(
                f"data: {path} line {number}: data.category_column {category_column!r} must be a string, number or "
                f"boolean (got {json.dumps(row[category_column])})"
            )
        rows.append(row)
    if not rows:
        raise ValueError(f"data: {path} holds no rows")
    return rows


def _category_key(value: Any) -> tuple[int, bool | float | str] | None:
    """The sort key of a category value (booleans, then numbers, then strings; ``1`` and ``1.0`` are one category),
    or None for a value that is no category (null, a list, an object, a non-finite number)."""
    if isinstance(value, bool):
        return (0, value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return (1, value)
    return (2, value) if isinstance(value, str) else None


def category_ids(rows: list[dict[str, Any]], column: str) -> np.ndarray:
    """The ``column`` value of every row as an id: the sorted distinct values are 0, 1, ... (``int64``)."""
    keys = [key for key in (_category_key(row[column]) for row in rows) if key is not None]  # read_rows refused None
    index = {key: i for i, key in enumerate(sorted(set(keys)))}
    return np.array([index[key] for key in keys], dtype=np.int64)


def tokenise(rows: list[dict[str, Any]], tokenizer: Tokenizer, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids ``[N, seq_len]`` and labels ``[N, seq_len]`` of ``rows``."""
    eos = [tokenizer.eos_id] if tokenizer.eos_id is not None else []
    pairs = [
        encode_example(
            tokenizer.encode(prompt_of(row)), tokenizer.encode(row["output"]) + eos, seq_len, tokenizer.pad_id
        )
        for row in rows
    ]
    return torch.tensor([p[0] for p in pairs], dtype=torch.int64), torch.tensor([p[1] for p in pairs])


def split_rows(
    rows: list[dict[str, Any]],
    test_path: str | None,
    test_fraction: float,
    read: Callable[[Path], list[dict[str, Any]]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, test rows): the rows of ``test_path`` (read with ``read``) as the test rows, or without one
    the last ``test_fraction`` of ``rows``."""
    if test_path is not None:
        return rows, read(Path(test_path).expanduser())
    cut = len(rows) - int(round(len(rows) * test_fraction))
    return rows[:cut], rows[cut:]


def user_groups(rows: list[dict[str, Any]], user_column: str | None) -> np.ndarray | None:
    """Every row's user as an id (the sorted users are 0, 1, ...), or None without a user column."""
    if user_column is None:
        return None
    names = [str(row[user_column]) for row in rows]
    return np.unique(np.asarray(names), return_inverse=True)[1].astype(np.int64)


def jsonl_instructions(
    *,
    path: str,
    tokenizer: str,
    seq_len: int = 128,
    test_path: str | None = None,
    test_fraction: float = 0.1,
    user_column: str | None = None,
    eos_token: str = "<|endoftext|>",
    category_column: str | None = None,
    tokenizer_kind: str = "bpe",
    vocab_size: int = 8000,
    tokenizer_file: str | None = None,
) -> DataSplit:
    """Instruction data of the JSON Lines file ``path`` (see the module's docstring), tokenised with ``tokenizer``
    (:func:`~fedsim.data.tokenizer.load_tokenizer`), or with ``tokenizer="train"`` a ``tokenizer_kind`` tokenizer of
    at most ``vocab_size`` ids trained on the training rows' prompts and responses and saved to ``tokenizer_file``
    (:class:`~fedsim.data.tokenizer.TokenizerTraining`). The centralized test set is ``test_path``, or without one
    the last ``test_fraction`` of the rows. ``user_column``: the field naming each row's user, which
    ``partition=natural`` makes clients of; ``category_column``: the field whose sorted values are the training
    rows' categories (:func:`category_ids`), which ``partition=dirichlet`` and ``shards`` split by."""
    integer("data.seq_len", seq_len, 2)
    within("data.test_fraction", test_fraction, "[0, 1)")
    training = TokenizerTraining(tokenizer_kind, vocab_size, tokenizer_file)
    rows = read_rows(Path(path).expanduser(), user_column, category_column=category_column)
    rows, test_rows = split_rows(rows, test_path, test_fraction, lambda file: read_rows(file, None))
    tok = tokenizer_for(tokenizer, eos_token, training, lambda: (prompt_of(row) + row["output"] for row in rows))
    x, y = tokenise(rows, tok, seq_len)
    test_x, test_y = (
        tokenise(test_rows, tok, seq_len)
        if test_rows
        else (torch.zeros(0, seq_len, dtype=torch.int64), torch.zeros(0, seq_len, dtype=torch.int64))
    )
    categories = category_ids(rows, category_column) if category_column is not None else None
    train = TensorData(x, y, tok.vocab_size, user_groups(rows, user_column), categories)
    return DataSplit(train, TensorData(test_x, test_y, tok.vocab_size))


def class_ids(labels: list[Any], where: str) -> tuple[list[int], list[str] | None]:
    """Class ids of ``labels`` and the sorted class names (``None`` when the labels are ids already); one line naming
    ``where`` for labels that mix ids and names or hold anything else."""
    if all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in labels):
        return list(labels), None
    if all(isinstance(v, str) for v in labels):
        names = sorted(set(labels))
        index = {name: i for i, name in enumerate(names)}
        return [index[v] for v in labels], names
    bad = next(v for v in labels if not isinstance(v, str))
    raise ValueError(
        f"data: {where}: labels must be all class ids (integers >= 0) or all class names (strings); found {bad!r}"
    )


def encode_texts(texts: list[str], tokenizer: Tokenizer, seq_len: int, where: Path) -> torch.Tensor:
    """Token ids ``[N, seq_len]``: each text's first ``seq_len`` tokens, padded on the right; one line naming the
    file for a text without tokens."""
    out = torch.full((len(texts), seq_len), tokenizer.pad_id, dtype=torch.int64)
    for i, text in enumerate(texts):
        ids = tokenizer.encode(text)[:seq_len]
        if not ids:
            raise ValueError(f"data: {where}: row {i + 1} has a text without tokens; remove it or give it text")
        out[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
    return out


def jsonl_classification(
    *,
    path: str,
    tokenizer: str,
    seq_len: int = 128,
    text_column: str = "text",
    label_column: str = "label",
    test_path: str | None = None,
    test_fraction: float = 0.1,
    user_column: str | None = None,
    eos_token: str = "<|endoftext|>",
    category_column: str | None = None,
    tokenizer_kind: str = "bpe",
    vocab_size: int = 8000,
    tokenizer_file: str | None = None,
) -> DataSplit:
    """Text classification rows of the JSON Lines file ``path`` (see the module's docstring), tokenised with
    ``tokenizer`` (no end-of-sequence token is added; ``"train"``: trained on the training rows' texts). The
    tokenizer keys, the test set, ``user_column`` and ``category_column`` (partition by it instead of by the label)
    as :func:`jsonl_instructions`. The data's :attr:`~fedsim.data.tensor_data.TensorData.vocab_size` is the
    tokenizer's (``model.vocab_size=null`` takes it)."""
    integer("data.seq_len", seq_len, 1)
    within("data.test_fraction", test_fraction, "[0, 1)")
    training = TokenizerTraining(tokenizer_kind, vocab_size, tokenizer_file)
    train_file = Path(path).expanduser()
    columns = (text_column, label_column)
    rows = read_rows(train_file, user_column, columns, strings=1, category_column=category_column)
    test_file = Path(test_path).expanduser() if test_path is not None else train_file
    rows, test_rows = split_rows(rows, test_path, test_fraction, lambda file: read_rows(file, None, columns, strings=1))
    tok = tokenizer_for(tokenizer, eos_token, training, lambda: (row[text_column] for row in rows))
    labels, _ = class_ids([r[label_column] for r in rows + test_rows], f"{path} {label_column!r}")
    y = torch.tensor(labels, dtype=torch.int64)
    classes = int(y.max()) + 1
    x = encode_texts([r[text_column] for r in rows], tok, seq_len, train_file)
    test_x = encode_texts([r[text_column] for r in test_rows], tok, seq_len, test_file)
    categories = category_ids(rows, category_column) if category_column is not None else None
    train = TensorData(x, y[: len(rows)], classes, user_groups(rows, user_column), categories, tok.vocab_size)
    return DataSplit(train, TensorData(test_x, y[len(rows) :], classes, vocab_size=tok.vocab_size))
