"""Write tiny LEAF folders in the real on-disk format (Caldas et al. 2018, https://github.com/TalwalkarLab/leaf):
``<root>/leaf/<dataset>/data/{train,test}/*.json``, every file ``{"users": [...], "num_samples": [...],
"user_data": {user: {"x": [...], "y": [...]}}}`` in the key order LEAF's scripts write, named like LEAF's
(``all_data_0_niid_0_keep_0_train_9.json``). Users are spread round-robin over the files of a part; every user
is in the train and the test files. CelebA also gets its JPEGs in ``data/raw/img_align_celeba``.

The examples are learnable: FEMNIST/CelebA images have the bright-cell pattern of ``tests/vision_files.py``,
Sent140 tweets use positive or negative words by label, Shakespeare windows come from one passage.
:func:`read_leaf_folder` reads a folder back with ``json`` alone, for tests to compare against. Does not import
fedsim.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds vision_files
from vision_files import cycled_labels, pattern_images  # noqa: E402

PARTS = ("train", "test")
PLAY = (
    "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer The slings and "
    "arrows of outrageous fortune, Or to take arms against a sea of troubles, And by opposing end them? "
    "$5 for thy thoughts, sweet Ophélie! "
)  # '$' and 'é' are outside LEAF's alphabet
GOOD = ("love", "great", "happy", "awesome", "fun", "!", "thanks")
BAD = ("hate", "awful", "sad", "terrible", "sick", "ugh", "tired")
OTHER = ("the", "day", "is", "today", "my", "work", "so", ",", "I'm")
CELEBA_SIZE = (18, 22)  # width, height: non-square like CelebA's aligned 178x218 images

Examples = dict[str, tuple[list, list]]
"""user → (x list, y list), as in a LEAF file's user_data."""


def uneven_sizes(n: int, parts: int) -> list[int]:
    """``n`` split into ``parts`` sizes in proportion 1 : 2 : ... : parts (largest remainder; they sum to ``n``)."""
    quota = n * np.arange(1, parts + 1) / (parts * (parts + 1) / 2)
    sizes = np.floor(quota).astype(np.int64)
    sizes[np.argsort(sizes - quota, kind="stable")[: n - int(sizes.sum())]] += 1
    return [int(s) for s in sizes]


def user_ids(name: str, users: int) -> list[str]:
    """LEAF-like user ids, created in reverse sorted order (so a reader must sort them itself)."""
    stem = {
        "femnist": "f{:04d}_{:02d}",
        "shakespeare": "THE_TRAGEDY_OF_HAMLET_{:02d}_{:02d}",
        "sent140": "tweeter{:03d}_{:02d}",
        "celeba": "{:04d}{:02d}",
    }[name]
    return [stem.format(i, i * 7 % 100) for i in reversed(range(users))]


def femnist_examples(n: int, rng: np.random.Generator, first: int) -> tuple[list, list]:
    """``n`` FEMNIST rows: 784 floats in 0..1 (rounded to 4 digits as text) and labels 0..61."""
    labels = cycled_labels(n, 62, rng)
    pixels = np.round(pattern_images(labels, 62, 28, 1, rng).reshape(n, 784) / 255.0, 4)
    return pixels.tolist(), [int(v) for v in labels]


def shakespeare_examples(n: int, rng: np.random.Generator, first: int) -> tuple[list, list]:
    """``n`` windows of 80 characters of :data:`PLAY` and the character after each."""
    text = PLAY * 3
    starts = [(first + i) * 3 % len(PLAY) for i in range(n)]
    return [text[s : s + 80] for s in starts], [text[s + 80] for s in starts]


def sent140_examples(n: int, rng: np.random.Generator, first: int) -> tuple[list, list]:
    """``n`` tweets ``[id, date, query, user, text]``; label 1 tweets use :data:`GOOD` words, 0 ones :data:`BAD`."""
    labels = [int(v) for v in cycled_labels(n, 2, rng)]
    rows = []
    for i, label in enumerate(labels):
        words = list(rng.choice(GOOD if label else BAD, size=3)) + list(
            rng.choice(OTHER, size=int(rng.integers(1, 30)))
        )
        tweet = " ".join(str(w) for w in rng.permutation(words)).capitalize()
        rows.append([str(1467810369 + first + i), "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "someone", tweet])
    return rows, labels


def celeba_examples(n: int, rng: np.random.Generator, first: int) -> tuple[list, list]:
    """``n`` image names (``000001.jpg``, ...) and smiling labels; the images are written by :func:`write_celeba`."""
    return [f"{first + i + 1:06d}.jpg" for i in range(n)], [int(v) for v in cycled_labels(n, 2, rng)]


EXAMPLES: dict[str, Callable[[int, np.random.Generator, int], tuple[list, list]]] = {
    "femnist": femnist_examples,
    "shakespeare": shakespeare_examples,
    "sent140": sent140_examples,
    "celeba": celeba_examples,
}


def leaf_folder(root: str | Path, name: str) -> Path:
    """Where the readers look by default: ``<root>/leaf/<name>/data``."""
    return Path(root) / "leaf" / name / "data"


def make_examples(name: str, n_train: int, n_test: int, users: int = 4, seed: int = 0) -> dict[str, Examples]:
    """``{part: {user: (xs, ys)}}`` with ``n_train`` / ``n_test`` rows over ``users`` users of uneven sizes."""
    if n_train < users:
        raise ValueError(f"leaf_files: n_train ({n_train}) must be >= users ({users}): every user trains")
    rng = np.random.default_rng(seed)
    out: dict[str, Examples] = {}
    first = 0
    for part, n in zip(PARTS, (n_train, n_test), strict=True):
        out[part] = {}
        for user, size in zip(user_ids(name, users), uneven_sizes(n, users), strict=True):
            out[part][user] = EXAMPLES[name](size, rng, first)
            first += size
    return out


def write_part(folder: Path, part: str, examples: Examples, files: int, hierarchies: bool = False) -> list[Path]:
    """Write one part's users round-robin into ``files`` LEAF json files; returns their paths."""
    (folder / part).mkdir(parents=True, exist_ok=True)
    users = list(examples)
    paths = []
    for k in range(files):
        mine = users[k::files]
        data: dict[str, Any] = {"users": mine, "num_samples": [len(examples[u][1]) for u in mine]}
        if hierarchies:
            data["hierarchies"] = ["hsf_0"] * len(mine)
        data["user_data"] = {u: {"x": examples[u][0], "y": examples[u][1]} for u in mine}
        path = folder / part / f"all_data_{k}_niid_0_keep_0_{part}_9.json"
        path.write_text(json.dumps(data))
        paths.append(path)
    return paths


def write_leaf(
    root: str | Path,
    name: str,
    n_train: int,
    n_test: int,
    *,
    users: int = 4,
    train_files: int = 2,
    test_files: int = 1,
    seed: int = 0,
) -> dict[str, Examples]:
    """Write ``<root>/leaf/<name>/data`` (and CelebA's images); returns what was written, as :func:`make_examples`."""
    examples = make_examples(name, n_train, n_test, users, seed)
    folder = leaf_folder(root, name)
    for part, files in zip(PARTS, (train_files, test_files), strict=True):
        write_part(folder, part, examples[part], files, hierarchies=name == "femnist")
    if name == "celeba":
        write_celeba_images(folder / "raw" / "img_align_celeba", examples, seed)
    return examples


def write_celeba_images(images: Path, examples: dict[str, Examples], seed: int = 0) -> None:
    """One small JPEG per CelebA row, its bright cell at the label's place (left half: not smiling)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    images.mkdir(parents=True, exist_ok=True)
    for part in examples.values():
        for names, labels in part.values():
            pixels = pattern_images(np.asarray(labels), 2, max(CELEBA_SIZE), 3, rng)
            for file_name, image in zip(names, pixels, strict=True):
                Image.fromarray(image[: CELEBA_SIZE[1], : CELEBA_SIZE[0]]).save(images / file_name, quality=95)


def read_leaf_folder(folder: str | Path) -> dict[str, Examples]:
    """``{part: {user: (xs, ys)}}`` of every json file under ``folder/{train,test}``, read with ``json`` alone."""
    out: dict[str, Examples] = {}
    for part in PARTS:
        out[part] = {}
        for path in sorted((Path(folder) / part).glob("*.json")):
            data = json.loads(path.read_text())
            out[part].update({u: (d["x"], d["y"]) for u, d in data["user_data"].items()})
    return out


def write_femnist(root: Path, n_train: int, n_test: int) -> list[str]:
    """FEMNIST over 4 writers in 2 train files and 1 test file; returns ``data.root``."""
    write_leaf(root, "femnist", n_train, n_test)
    return [f"data.root={root}"]


def write_shakespeare(root: Path, n_train: int, n_test: int) -> list[str]:
    """Shakespeare over 4 roles in 2 train files and 1 test file; returns ``data.root``."""
    write_leaf(root, "shakespeare", n_train, n_test)
    return [f"data.root={root}"]


def write_sent140(root: Path, n_train: int, n_test: int) -> list[str]:
    """Sent140 over 4 users in 2 train files and 1 test file; returns ``data.root``."""
    write_leaf(root, "sent140", n_train, n_test)
    return [f"data.root={root}"]


def write_celeba(root: Path, n_train: int, n_test: int) -> list[str]:
    """CelebA over 4 celebrities (JSON and JPEGs); returns ``data.root`` and a small ``data.image_size`` (fast)."""
    write_leaf(root, "celeba", n_train, n_test)
    return [f"data.root={root}", "data.image_size=16"]
