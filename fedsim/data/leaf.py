"""The LEAF benchmark's datasets with their natural clients and LEAF's own per-user train/test split.

Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018, https://github.com/TalwalkarLab/leaf. LEAF's
preprocessing (``cd leaf/data/<dataset> && ./preprocess.sh ...``) writes ``data/train/*.json`` and
``data/test/*.json``, one or more files each, every file ``{"users": [...], "num_samples": [...], "user_data":
{user: {"x": [...], "y": [...]}}}`` (some also hold ``"hierarchies"``, ignored). A user's training examples are in
the train files, its test examples in the test files. Read from ``<root>/leaf/<dataset>/data`` (or ``folder``):

* :func:`femnist`: x = 784 pixel values (28x28, row-major) → float32 ``(N, 1, 28, 28)`` exactly as stored (LEAF's
  0..1 scale, which its CNN reads as it is; not mean/std-normalised); y = class 0..61, ``num_classes`` 62.
* :func:`shakespeare`: x = 80 characters, y = the next one → int64 ids ``(N, 80)`` and ``(N,)`` in LEAF's alphabet,
  any other character id 80 (:mod:`fedsim.data.text`); ``num_classes`` 81.
* :func:`sent140`: x = ``[tweet id, date, query, user, text]``, y = 0/1 → the text's word ids ``(N, max_words)``
  (:mod:`fedsim.data.text`; the vocabulary comes from the TRAINING tweets only, or from a GloVe file).
* :func:`celeba`: x = a JPEG name in ``data/raw/img_align_celeba``, y = smiling 0/1 → float32 ``(N, 3, S, S)``
  (:mod:`fedsim.data.leaf_images`).

The result has fedsim's pooled layout (:class:`~fedsim.data.tensor_data.DataSplit`): all training rows, then all
test rows, in one tensor; ``local_test`` marks the test rows, ``test`` is a zero-copy view of them and ``groups``
holds every row's user id (a numpy string array). Within each part the users come in sorted order, each user's
rows in file order. With ``partition=natural`` every user is one client that trains on its training rows and tests
on its own test rows. Memory: the row counts come from each file's ``num_samples`` (read from the start of the file
without parsing the rest), the output is allocated once and filled file by file, so the peak is the output plus one
parsed file. A NaN or infinite pixel or label (Python's JSON writes and reads ``NaN`` and ``Infinity``) is refused in
one line naming the file, the user and the row (:mod:`fedsim.data.finite`).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsim.core.errors import DatasetNotFoundError
from fedsim.data import text
from fedsim.data.finite import check_finite
from fedsim.data.leaf_images import read_images
from fedsim.data.reading import not_utf8
from fedsim.data.tensor_data import DataSplit, pooled_split

LEAF_REPO = "https://github.com/TalwalkarLab/leaf"
PREPROCESS = {
    "femnist": "./preprocess.sh -s niid --sf 1.0 -k 0 -t sample",
    "shakespeare": "./preprocess.sh -s niid --sf 1.0 -k 0 -t sample -tf 0.8",
    "sent140": "./preprocess.sh -s niid --sf 1.0 -k 3 -t sample",
    "celeba": "./preprocess.sh -s niid --sf 1.0 -k 5 -t sample",
}
"""The LEAF preprocessing command named in the error for missing files (LEAF's README has smaller samples)."""
CELEBA_SOURCE = (
    "http://mmlab.ie.cuhk.edu.hk/projects/CelebA.html (img_align_celeba.zip, unzipped into "
    "leaf/data/celeba/data/raw, as LEAF's data/celeba/README.md says)"
)
FEMNIST_PIXELS, FEMNIST_CLASSES = 784, 62
PARTS = ("train", "test")


@dataclass(frozen=True)
class Where:
    """One user's examples in one file; reads ``<path>: user '<user>'`` in messages."""

    path: str
    user: str

    def __str__(self) -> str:
        return f"{self.path}: user {self.user!r}"


Convert = Callable[[list, list, int, Where], None]
"""``convert(xs, ys, first_row, where)``: write one user's examples into the output from ``first_row`` on."""


@dataclass(frozen=True)
class Layout:
    """Where every user's rows go: ``slots[file][user] = (first row, count)``; rows of all train files first, users
    sorted within each part. ``groups`` holds every row's user, ``n_train`` the number of training rows."""

    name: str
    slots: dict[str, dict[str, tuple[int, int]]]
    groups: np.ndarray
    n_train: int

    def fill(self, convert: Convert) -> None:
        """Parse every file once and hand each user's examples to ``convert`` (after checking the counts)."""
        for path, users in self.slots.items():
            data = _load(path, self.name)
            user_data = data.get("user_data")
            if not isinstance(user_data, dict):
                raise ValueError(f"data={self.name}: {path} has no 'user_data' object; {_rerun(self.name)}")
            for user, (start, count) in users.items():
                xs, ys = _examples(user_data, user, path, self.name)
                if not len(xs) == len(ys) == count:
                    raise ValueError(
                        f"data={self.name}: {path}: user {user!r} has {len(xs)} x and {len(ys)} y but "
                        f"num_samples says {count}; the file is damaged: {_rerun(self.name)}"
                    )
                if count:
                    convert(xs, ys, start, Where(path, user))
            del data, user_data  # free this file's parse before the next one is read

    def split(self, x: torch.Tensor, y: torch.Tensor, num_classes: int) -> DataSplit:
        """The pooled :class:`DataSplit` of ``x``/``y`` (all rows, laid out as :attr:`slots` says)."""
        return pooled_split(x, y, num_classes, self.groups, self.n_train)


def _rerun(name: str) -> str:
    """How to remake damaged files."""
    return f"run LEAF's preprocessing again ({LEAF_REPO}: cd leaf/data/{name} && {PREPROCESS[name]})"


def _data_folder(name: str, root: str | Path, folder: str | Path | None) -> str:
    """``folder``, or by default ``<root>/leaf/<name>/data``."""
    if folder is not None:
        return os.path.expanduser(str(folder))
    return os.path.join(os.path.expanduser(str(root)), "leaf", name, "data")


def _json_files(name: str, folder: str, part: str) -> list[str]:
    """The part's ``*.json`` files, sorted; a one-line :class:`DatasetNotFoundError` when there are none."""
    files = sorted(glob.glob(os.path.join(glob.escape(folder), part, "*.json")))
    if not files:
        raise DatasetNotFoundError(
            f"data={name}: no LEAF .json files in {os.path.join(folder, part)}; get {LEAF_REPO}, run "
            f"`cd leaf/data/{name} && {PREPROCESS[name]}` and set data.folder to its data folder (holding train/ "
            f"and test/), or copy that folder to <data.root>/leaf/{name}/data"
        )
    return files


def _load(path: str, name: str) -> dict[str, Any]:
    """A whole JSON file; one line naming the file when it is not valid JSON (e.g. truncated), and the line when it
    is not UTF-8 text (:func:`fedsim.data.reading.not_utf8`)."""
    try:
        with open(path, "rb") as handle:
            data = json.load(handle)
    except UnicodeDecodeError as err:
        raise not_utf8(err, path) from None
    except json.JSONDecodeError as err:
        raise DatasetNotFoundError(
            f"data={name}: cannot parse {path} as JSON (truncated or not LEAF output: "
            f"{' '.join(str(err).split())[:150]}); {_rerun(name)}"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(
            f"data={name}: {path} holds a JSON {type(data).__name__}, not LEAF's object with users, "
            f"num_samples and user_data; {_rerun(name)}"
        )
    return data


def _head(path: str, limit: int = 64 << 20) -> dict[str, Any] | None:
    """The keys before ``"user_data"`` (LEAF writes users and num_samples first), read from the start of the file
    without parsing the rest; ``None`` when that fails (then the caller parses the whole file)."""
    key = b'"user_data"'
    buffer = bytearray()
    with open(path, "rb") as handle:
        while len(buffer) < limit and (block := handle.read(1 << 20)):
            seen = max(0, len(buffer) - len(key))
            buffer += block
            at = buffer.find(key, seen)
            if at < 0:
                continue
            head = bytes(buffer[:at]).rstrip()
            try:
                data = json.loads(head[:-1] + b"}") if head.endswith(b",") else None
            except (json.JSONDecodeError, UnicodeDecodeError):
                return None
            return data if isinstance(data, dict) else None
    return None


def _users(path: str, name: str) -> list[tuple[str, int]]:
    """``(user, num_samples)`` of one file, checked."""
    data = _head(path) or _load(path, name)
    for key in ("users", "num_samples"):
        if not isinstance(data.get(key), list):
            raise ValueError(
                f"data={name}: {path} has no '{key}' list; LEAF files hold users, num_samples and "
                f"user_data: {_rerun(name)}"
            )
    users, counts = data["users"], data["num_samples"]
    if len(users) != len(counts):
        raise ValueError(f"data={name}: {path} lists {len(users)} users but {len(counts)} num_samples; {_rerun(name)}")
    for user, count in zip(users, counts, strict=True):
        if not isinstance(user, str) or not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(
                f"data={name}: {path}: user {user!r} has num_samples {count!r}; users must be strings "
                f"and num_samples counts >= 0"
            )
    return list(zip(users, counts, strict=True))


def read_layout(name: str, root: str | Path, folder: str | Path | None) -> Layout:
    """Where the rows of LEAF dataset ``name`` go: every file's users and counts read (from the head of each file,
    without parsing the examples) and each user's rows placed (:class:`Layout`). The readers here and
    :func:`fedsim.data.text_corpus.shakespeare_lm` fill their arrays through it."""
    where = _data_folder(name, root, folder)
    slots: dict[str, dict[str, tuple[int, int]]] = {}
    owners: list[str] = []
    sizes: list[int] = []
    n_train = 0
    for part in PARTS:
        home: dict[str, tuple[str, int]] = {}
        for path in _json_files(name, where, part):
            slots[path] = {}
            for user, count in _users(path, name):
                if user in home:
                    raise ValueError(
                        f"data={name}: user {user!r} is in two {part} files, {home[user][0]} and "
                        f"{path}; each user may appear once per part: remove stale files"
                    )
                home[user] = (path, count)
        start = sum(sizes)
        for user in sorted(home):
            path, count = home[user]
            slots[path][user] = (start, count)
            owners.append(user)
            sizes.append(count)
            start += count
        if part == "train":
            n_train = start
    groups = np.repeat(np.array(owners, dtype=str), sizes) if owners else np.zeros(0, dtype=str)
    return Layout(name, slots, groups, n_train)


def _examples(user_data: dict[str, Any], user: str, path: str, name: str) -> tuple[list, list]:
    """One user's ``x`` and ``y`` lists."""
    entry = user_data.get(user)
    if not isinstance(entry, dict):
        raise ValueError(
            f"data={name}: {path}: user {user!r} is listed in 'users' but has no entry in 'user_data'; {_rerun(name)}"
        )
    for key in ("x", "y"):
        if not isinstance(entry.get(key), list):
            raise ValueError(f"data={name}: {path}: user {user!r} has no '{key}' list in user_data; {_rerun(name)}")
    return entry["x"], entry["y"]


def _labels(ys: list, num_classes: int, where: Where, name: str) -> np.ndarray:
    """Integer class labels in ``0..num_classes-1`` as int64 (a NaN or infinite one named as such)."""
    arr = np.asarray(ys)
    if arr.ndim == 1:
        check_finite(arr, "y", source=where.path, owners=where.user)
    if arr.ndim != 1 or (arr.size and (arr.dtype.kind not in "iuf" or not np.array_equal(arr, np.round(arr)))):
        raise ValueError(f"data={name}: {where} has labels that are not class numbers (y[0] = {ys[0]!r})")
    if arr.size and (arr.min() < 0 or arr.max() >= num_classes):
        bad = int(np.flatnonzero((arr < 0) | (arr >= num_classes))[0])
        raise ValueError(f"data={name}: {where}, row {bad} has label {ys[bad]!r}; labels must be 0..{num_classes - 1}")
    return arr.astype(np.int64)


def femnist(*, root: str | Path, folder: str | Path | None = None) -> DataSplit:
    """LEAF's FEMNIST: handwritten characters of 3,500 writers, 62 classes; see the module docstring."""
    layout = read_layout("femnist", root, folder)
    x = np.empty((len(layout.groups), FEMNIST_PIXELS), dtype=np.float32)
    y = np.empty(len(layout.groups), dtype=np.int64)

    def convert(xs: list, ys: list, start: int, where: Where) -> None:
        for i, row in enumerate(xs):
            if not isinstance(row, list) or len(row) != FEMNIST_PIXELS:
                size = len(row) if isinstance(row, list) else type(row).__name__
                raise ValueError(
                    f"data=femnist: {where}, row {i} has {size} pixel values; FEMNIST rows must have "
                    f"{FEMNIST_PIXELS} (28x28): {_rerun('femnist')}"
                )
        try:
            x[start : start + len(xs)] = xs
        except (TypeError, ValueError):
            raise ValueError(f"data=femnist: {where} has pixel values that are not numbers") from None
        check_finite(x[start : start + len(xs)], "x", source=where.path, owners=where.user)  # JSON allows NaN
        y[start : start + len(ys)] = _labels(ys, FEMNIST_CLASSES, where, "femnist")

    layout.fill(convert)
    images = torch.from_numpy(x).view(-1, 1, 28, 28)
    return layout.split(images, torch.from_numpy(y), FEMNIST_CLASSES)


def shakespeare(*, root: str | Path, folder: str | Path | None = None, seq_length: int = 80) -> DataSplit:
    """LEAF's Shakespeare: next-character prediction, one client per speaking role; see the module docstring.

    Windows of another length than ``seq_length`` are cut or padded as :func:`fedsim.data.text.encode_characters` says.
    """
    layout = read_layout("shakespeare", root, folder)
    x = np.empty((len(layout.groups), seq_length), dtype=np.int64)
    y = np.empty(len(layout.groups), dtype=np.int64)

    def convert(xs: list, ys: list, start: int, where: Where) -> None:
        try:
            x[start : start + len(xs)] = text.encode_characters(xs, seq_length)
            y[start : start + len(ys)] = text.character_ids(ys)
        except ValueError as err:
            raise ValueError(f"data=shakespeare: {where}: {err} (x must be strings, y single characters)") from None

    layout.fill(convert)
    return layout.split(torch.from_numpy(x), torch.from_numpy(y), text.NUM_CHARACTER_IDS)


def sent140(
    *,
    root: str | Path,
    folder: str | Path | None = None,
    vocab_size: int | None = 10002,
    glove: str | Path | None = None,
    max_words: int = 25,
) -> DataSplit:
    """LEAF's Sent140: tweet sentiment (0 negative, 1 positive), one client per Twitter user.

    Word ids (:mod:`fedsim.data.text`): 0 padding, 1 unknown. ``vocab_size`` counts those two, as a model's
    embedding does: without ``glove`` the ``vocab_size - 2`` most frequent words of the training tweets (ties by
    word), with ``glove`` the file's first ``vocab_size - 2`` words in file order (line ``i`` → id ``i + 2``);
    ``None`` keeps every word.
    """
    if max_words < 1 or (vocab_size is not None and vocab_size < text.RESERVED_IDS + 1):
        raise ValueError(
            f"data=sent140: max_words must be >= 1 and vocab_size >= 3 or null (got {max_words} and {vocab_size})"
        )
    layout = read_layout("sent140", root, folder)
    tweets = np.empty(len(layout.groups), dtype=object)
    y = np.empty(len(layout.groups), dtype=np.int64)

    def convert(xs: list, ys: list, start: int, where: Where) -> None:
        for i, row in enumerate(xs):
            if not isinstance(row, list) or not row or not isinstance(row[-1], str):
                raise ValueError(
                    f"data=sent140: {where}, row {i} is {str(row)[:80]!r}, not LEAF's "
                    "[tweet id, date, query, user, text]"
                )
            tweets[start + i] = row[-1]
        y[start : start + len(ys)] = _labels(ys, 2, where, "sent140")

    layout.fill(convert)
    if glove is not None:
        vocabulary = text.read_glove_words(glove, None if vocab_size is None else vocab_size - text.RESERVED_IDS)
    else:
        vocabulary = text.most_frequent_words(tweets[: layout.n_train], vocab_size)
    x = text.encode_words(tweets, vocabulary, max_words)
    return layout.split(torch.from_numpy(x), torch.from_numpy(y), 2)


def celeba(
    *,
    root: str | Path,
    folder: str | Path | None = None,
    image_folder: str | Path | None = None,
    image_size: int = 84,
    image_mean: float | list[float] = 0.5,
    image_std: float | list[float] = 0.5,
) -> DataSplit:
    """LEAF's CelebA: smiling or not, one client per celebrity; images from ``image_folder`` (default
    ``<folder>/raw/img_align_celeba``), resized to ``image_size`` and normalised (:mod:`fedsim.data.leaf_images`)."""
    layout = read_layout("celeba", root, folder)
    images = (
        os.path.expanduser(str(image_folder))
        if image_folder is not None
        else os.path.join(_data_folder("celeba", root, folder), "raw", "img_align_celeba")
    )
    if not os.path.isdir(images):
        raise DatasetNotFoundError(
            f"data=celeba: no image folder {images}; download the aligned images from "
            f"{CELEBA_SOURCE}, or set data.image_folder"
        )
    present = set(os.listdir(images))
    names = np.empty(len(layout.groups), dtype=object)
    y = np.empty(len(layout.groups), dtype=np.int64)

    def convert(xs: list, ys: list, start: int, where: Where) -> None:
        for i, file_name in enumerate(xs):
            if not isinstance(file_name, str) or file_name not in present:
                raise DatasetNotFoundError(
                    f"data=celeba: {where}, row {i} names the image {file_name!r}, which is "
                    f"not in {images}; get the images from {CELEBA_SOURCE}"
                )
            names[start + i] = os.path.join(images, file_name)
        y[start : start + len(ys)] = _labels(ys, 2, where, "celeba")

    layout.fill(convert)
    x = read_images(list(names), image_size, mean=image_mean, std=image_std, source=CELEBA_SOURCE)
    return layout.split(x, torch.from_numpy(y), 2)
