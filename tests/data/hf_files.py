"""Write tiny Hugging Face ``datasets`` copies in the real on-disk formats (``save_to_disk`` folders, parquet).

The rows imitate the Hub copies fedsim has presets for: flwrlabs/femnist (``image`` 28x28 grayscale PIL images,
``writer_id``, ``hsf_id``, ``character`` ClassLabel 0..61) and flwrlabs/shakespeare (``character_id``, ``x`` 80
characters, ``y`` the next character). Every FEMNIST-like image carries its own row number in pixels (0, 0) and
(0, 1) (``row % 256``, ``row // 256``) so a test can find the source row of any output row; the rest of the
image is a bright cell at the label's grid position on a dark noisy background (learnable by a linear model).

Import-safe without ``datasets``: it is imported only when a writer runs. Does not import fedsim.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

FEMNIST_CLASSES = 62
PLAY = (
    "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer "
    "The slings and arrows of outrageous fortune, Or to take arms against a sea of troubles. "
)


def femnist_images(labels: np.ndarray, first_row: int = 0, seed: int = 0, size: int = 28) -> np.ndarray:
    """uint8 ``(N, size, size)``: the label's grid cell bright, row number ``first_row + i`` in pixels 0 and 1."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 60, size=(len(labels), size, size), dtype=np.uint8)
    side = math.ceil(math.sqrt(FEMNIST_CLASSES))
    cell = size // side
    for i, label in enumerate(labels):
        r, c = divmod(int(label), side)
        images[i, r * cell : (r + 1) * cell, c * cell : (c + 1) * cell] = 220
        row = first_row + i
        images[i, 0, 0], images[i, 0, 1] = row % 256, row // 256
    return images


def source_rows(x: Any) -> np.ndarray:
    """The source row numbers stored in loaded FEMNIST-like images (``x`` scaled as pixel / 255)."""
    pixels = np.rint(np.asarray(x)[:, 0, 0, :2] * 255).astype(np.int64)
    return pixels[:, 0] + 256 * pixels[:, 1]


def writers_of(n: int, writers: int) -> list[str]:
    """``n`` writer ids, row ``i`` belonging to writer ``i % writers`` (ids as in flwrlabs/femnist)."""
    return [f"f{i % writers:04d}_{i % writers:02d}" for i in range(n)]


def femnist_dataset(n: int, writers: int = 3, first_row: int = 0, seed: int = 0) -> Any:
    """A FEMNIST-like ``datasets.Dataset`` with a real ``Image`` feature (PIL images, stored as PNG)."""
    import datasets
    from PIL import Image

    labels = (np.arange(n) * 7 + seed) % FEMNIST_CLASSES
    images = femnist_images(labels, first_row, seed)
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "writer_id": datasets.Value("string"),
            "hsf_id": datasets.Value("int64"),
            "character": datasets.ClassLabel(names=[str(k) for k in range(FEMNIST_CLASSES)]),
        }
    )
    return datasets.Dataset.from_dict(
        {
            "image": [Image.fromarray(a, mode="L") for a in images],
            "writer_id": writers_of(n, writers),
            "hsf_id": [i % 8 for i in range(n)],
            "character": labels.tolist(),
        },
        features=features,
    )


def shakespeare_dataset(n: int, roles: int = 3, first_row: int = 0) -> Any:
    """A Shakespeare-like ``datasets.Dataset``: ``x`` an 80-character window of :data:`PLAY`, ``y`` the next one."""
    import datasets

    text = PLAY * 3
    starts = [(first_row + i) * 7 % len(PLAY) for i in range(n)]
    return datasets.Dataset.from_dict(
        {
            "character_id": [f"THE_PLAY_ROLE_{i % roles}" for i in range(n)],
            "x": [text[s : s + 80] for s in starts],
            "y": [text[s + 80] for s in starts],
        }
    )


def _two_splits(make: Any, n_train: int, n_test: int) -> Any:
    """A ``DatasetDict`` with ``n_train`` "train" and ``n_test`` "test" rows over the same three clients."""
    import datasets

    return datasets.DatasetDict({"train": make(n_train, first_row=0), "test": make(n_test, first_row=n_train)})


def write_femnist_hf(root: Path, n_train: int, n_test: int) -> list[str]:
    """``root/femnist_hf``: a ``save_to_disk`` DatasetDict (train, test; 3 writers in both) for ``data=femnist_hf``."""
    folder = Path(root) / "femnist_hf"
    _two_splits(femnist_dataset, n_train, n_test).save_to_disk(str(folder))
    return [f"data.path={folder}", "data.test_split=test"]


def write_shakespeare_hf(root: Path, n_train: int, n_test: int) -> list[str]:
    """``root/shakespeare_hf/data/{train,test}-00000-of-00001.parquet`` (the Hub repository layout, 3 roles)."""
    folder = Path(root) / "shakespeare_hf"
    (folder / "data").mkdir(parents=True, exist_ok=True)
    for name, part in _two_splits(shakespeare_dataset, n_train, n_test).items():
        part.to_parquet(str(folder / "data" / f"{name}-00000-of-00001.parquet"))
    return [f"data.path={folder}", "data.test_split=test", f"data.cache_dir={Path(root) / 'hf_cache'}"]


def numeric_dataset(n: int, clients: int = 3, first_row: int = 0, with_clients: bool = True) -> Any:
    """Rows of ``features`` (8 float32 values; the label's position is 1) and ``label`` (int, 0..3)."""
    import datasets

    labels = (first_row + np.arange(n)) % 4
    values = np.random.default_rng(first_row).normal(0, 0.1, size=(n, 8)).astype(np.float32)
    values[np.arange(n), labels] += 1
    columns: dict[str, Any] = {"features": values.tolist(), "label": labels.tolist()}
    if with_clients:
        columns["user"] = [int(i % clients) for i in range(n)]
    features = {"features": datasets.List(datasets.Value("float32")), "label": datasets.Value("int64")}
    if with_clients:
        features["user"] = datasets.Value("int64")
    return datasets.Dataset.from_dict(columns, features=datasets.Features(features))


def write_hf(root: Path, n_train: int, n_test: int) -> list[str]:
    """``root/hf``: a ``save_to_disk`` DatasetDict for the generic ``data=hf``: "train" rows of 3 users, and a
    "test" split without a user column (then the test set is the server's only)."""
    import datasets

    folder = Path(root) / "hf"
    parts = {"train": numeric_dataset(n_train), "test": numeric_dataset(n_test, first_row=n_train, with_clients=False)}
    datasets.DatasetDict(parts).save_to_disk(str(folder))
    return [
        f"data.path={folder}",
        "data.client_column=user",
        "data.feature_column=features",
        "data.label_column=label",
        "data.test_split=test",
    ]
