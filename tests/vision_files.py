"""Write tiny image datasets in the real on-disk formats that torchvision reads (tests cannot download).

The images carry a learnable signal: the picture is split into a grid of cells (``ceil(sqrt(C))``
per side for ``C`` classes) and an example of class ``k`` has cell ``k`` bright (180..255) on a dark
noisy background (0..59), so even a linear model beats chance after a few steps. Labels cycle through
every class before being shuffled, so each class appears whenever ``n >= C``.

This module deliberately does not import fedsim: it writes files, the tests read them back.
"""

from __future__ import annotations

import math
import os
import pickle
import struct
from pathlib import Path

import numpy as np

CIFAR10_LABEL_NAMES = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
]
EMNIST_NUM_CLASSES = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 27, "digits": 10, "mnist": 10}


def cycled_labels(n: int, num_classes: int, rng: np.random.Generator, first: int = 0) -> np.ndarray:
    """``n`` labels in ``first..num_classes-1`` covering every class in turn, then shuffled."""
    labels = first + np.arange(n) % (num_classes - first)
    return rng.permutation(labels).astype(np.uint8)


def pattern_images(
    labels: np.ndarray, num_classes: int, size: int, channels: int, rng: np.random.Generator
) -> np.ndarray:
    """uint8 images ``(N, size, size, channels)`` whose bright grid cell is the label (see module doc)."""
    n = len(labels)
    images = rng.integers(0, 60, size=(n, size, size, channels), dtype=np.uint8)
    side = math.ceil(math.sqrt(num_classes))
    cell = size // side
    for i, label in enumerate(labels):
        r, c = divmod(int(label), side)
        patch = rng.integers(180, 256, size=(cell, cell, channels), dtype=np.uint8)
        images[i, r * cell : (r + 1) * cell, c * cell : (c + 1) * cell] = patch
    return images


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write a uint8 array of 1..3 dims as an uncompressed IDX file (magic ``0x0000080D``, D = ndim)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">I", 0x0800 + array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    Path(path).write_bytes(header + array.tobytes())


def _write_idx_part(raw: Path, prefix: str, images: np.ndarray, labels: np.ndarray) -> None:
    """Write ``<prefix>-images-idx3-ubyte`` and ``<prefix>-labels-idx1-ubyte`` into ``raw``."""
    write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
    write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)


def write_mnist(
    root: str | os.PathLike, n_train: int = 64, n_test: int = 32, seed: int = 0, folder: str = "MNIST"
) -> None:
    """Write ``root/<folder>/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte`` (10 classes, 28x28).

    ``folder="FashionMNIST"`` gives the Fashion-MNIST layout (same file names).
    """
    rng = np.random.default_rng(seed)
    raw = Path(root) / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = cycled_labels(n, 10, rng)
        _write_idx_part(raw, prefix, pattern_images(labels, 10, 28, 1, rng)[..., 0], labels)


def write_emnist(
    root: str | os.PathLike, split: str = "balanced", n_train: int = 94, n_test: int = 47, seed: int = 0
) -> None:
    """Write ``root/EMNIST/raw/emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte``.

    Like the real EMNIST files, each image is stored transposed (the pattern is drawn upright and
    written as ``image.T``). The letters split uses labels 1..26 as the real one does.
    """
    rng = np.random.default_rng(seed)
    num_classes = EMNIST_NUM_CLASSES[split]
    first = 1 if split == "letters" else 0
    raw = Path(root) / "EMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for part, n in (("train", n_train), ("test", n_test)):
        labels = cycled_labels(n, num_classes, rng, first=first)
        upright = pattern_images(labels, num_classes, 28, 1, rng)[..., 0]
        _write_idx_part(raw, f"emnist-{split}-{part}", upright.transpose(0, 2, 1), labels)


def _cifar_batch(images: np.ndarray, labels: np.ndarray, name: str) -> dict:
    """One CIFAR python batch: ``data`` is ``(N, 3072)`` uint8 in channel-plane (CHW) order."""
    return {
        "batch_label": name,
        "labels": [int(label) for label in labels],
        "data": images.transpose(0, 3, 1, 2).reshape(len(images), -1),
        "filenames": [f"img_{i:05d}.png" for i in range(len(images))],
    }


def _pickle(path: Path, obj: object) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def write_cifar10(root: str | os.PathLike, n_train: int = 50, n_test: int = 20, seed: int = 0) -> None:
    """Write ``root/cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}`` (pickles).

    The training examples are spread over the five batches. The files cannot match the official
    md5 checksums that torchvision checks, so read them with ``cifar10(..., verify_checksums=False)``.
    """
    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    labels = cycled_labels(n_train, 10, rng)
    images = pattern_images(labels, 10, 32, 3, rng)
    for i, idx in enumerate(np.array_split(np.arange(n_train), 5), start=1):
        batch = _cifar_batch(images[idx], labels[idx], f"training batch {i} of 5")
        _pickle(folder / f"data_batch_{i}", batch)
    test_labels = cycled_labels(n_test, 10, rng)
    test = _cifar_batch(pattern_images(test_labels, 10, 32, 3, rng), test_labels, "testing batch 1 of 1")
    _pickle(folder / "test_batch", test)
    meta = {"label_names": CIFAR10_LABEL_NAMES, "num_cases_per_batch": max(1, n_train // 5), "num_vis": 3072}
    _pickle(folder / "batches.meta", meta)
