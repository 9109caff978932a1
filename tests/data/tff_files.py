"""Write tiny CIFAR-100 and TFF FEMNIST files in their real on-disk formats (tests cannot download).

* :func:`write_cifar100`: ``root/cifar-100-python/{train,test,meta}``, the python pickles of
  https://www.cs.toronto.edu/~kriz/cifar.html, with ``fine_labels`` and ``coarse_labels``. The coarse label of
  every example comes from the superclass table published with the dataset (:data:`CIFAR100_SUPERCLASSES`, by
  name), not from fedsim's constant, so a test can check the constant against it.
* :func:`write_femnist_tff`: ``root/fed_emnist[_digitsonly]_{train,test}.h5`` in TFF's HDF5 layout, one group
  ``examples/<client_id>`` per writer holding ``pixels`` ``(n, 28, 28)`` float32 and ``label`` ``(n,)`` int32.

Both return the Hydra overrides that point their ``data=`` option at the files. Images carry the learnable
bright-cell pattern of ``tests/vision_files.py``. This module does not import fedsim.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds vision_files
from vision_files import cycled_labels, pattern_images  # noqa: E402

CIFAR100_SUPERCLASSES = {
    "aquatic_mammals": ("beaver", "dolphin", "otter", "seal", "whale"),
    "fish": ("aquarium_fish", "flatfish", "ray", "shark", "trout"),
    "flowers": ("orchid", "poppy", "rose", "sunflower", "tulip"),
    "food_containers": ("bottle", "bowl", "can", "cup", "plate"),
    "fruit_and_vegetables": ("apple", "mushroom", "orange", "pear", "sweet_pepper"),
    "household_electrical_devices": ("clock", "keyboard", "lamp", "telephone", "television"),
    "household_furniture": ("bed", "chair", "couch", "table", "wardrobe"),
    "insects": ("bee", "beetle", "butterfly", "caterpillar", "cockroach"),
    "large_carnivores": ("bear", "leopard", "lion", "tiger", "wolf"),
    "large_man-made_outdoor_things": ("bridge", "castle", "house", "road", "skyscraper"),
    "large_natural_outdoor_scenes": ("cloud", "forest", "mountain", "plain", "sea"),
    "large_omnivores_and_herbivores": ("camel", "cattle", "chimpanzee", "elephant", "kangaroo"),
    "medium_mammals": ("fox", "porcupine", "possum", "raccoon", "skunk"),
    "non-insect_invertebrates": ("crab", "lobster", "snail", "spider", "worm"),
    "people": ("baby", "boy", "girl", "man", "woman"),
    "reptiles": ("crocodile", "dinosaur", "lizard", "snake", "turtle"),
    "small_mammals": ("hamster", "mouse", "rabbit", "shrew", "squirrel"),
    "trees": ("maple_tree", "oak_tree", "palm_tree", "pine_tree", "willow_tree"),
    "vehicles_1": ("bicycle", "bus", "motorcycle", "pickup_truck", "train"),
    "vehicles_2": ("lawn_mower", "rocket", "streetcar", "tank", "tractor"),
}
"""CIFAR-100's 20 superclasses and their 5 classes each, as listed on the dataset's page."""

FINE_NAMES = sorted(name for names in CIFAR100_SUPERCLASSES.values() for name in names)
COARSE_NAMES = sorted(CIFAR100_SUPERCLASSES)
"""Label ``i`` is the ``i``-th name in alphabetical order, as in the real ``meta`` file."""


def coarse_label_of_fine() -> np.ndarray:
    """The coarse label of every fine label, worked out from the names (independently of fedsim)."""
    superclass = {fine: coarse for coarse, names in CIFAR100_SUPERCLASSES.items() for fine in names}
    return np.array([COARSE_NAMES.index(superclass[name]) for name in FINE_NAMES], dtype=np.int64)


def _cifar100_part(n: int, rng: np.random.Generator, name: str) -> dict:
    """One CIFAR-100 pickle: ``data`` ``(n, 3072)`` uint8 in channel-plane order, fine and coarse labels."""
    fine = cycled_labels(n, 100, rng)
    images = pattern_images(fine, 100, 32, 3, rng)
    return {
        "filenames": [f"img_{i:05d}.png" for i in range(n)],
        "batch_label": name,
        "fine_labels": [int(v) for v in fine],
        "coarse_labels": [int(v) for v in coarse_label_of_fine()[fine]],
        "data": images.transpose(0, 3, 1, 2).reshape(n, -1),
    }


def write_cifar100(root: str | Path, n_train: int = 200, n_test: int = 100, seed: int = 0) -> list[str]:
    """Write ``root/cifar-100-python/{train,test,meta}``; returns ``data.root`` and ``data.verify_checksums=false``
    (the files cannot match the official md5s). ``n >= 100`` covers every fine label."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    for file, n, name in (("train", n_train, "training batch 1 of 1"), ("test", n_test, "testing batch 1 of 1")):
        (folder / file).write_bytes(pickle.dumps(_cifar100_part(n, rng, name)))
    meta = {"fine_label_names": FINE_NAMES, "coarse_label_names": COARSE_NAMES}
    (folder / "meta").write_bytes(pickle.dumps(meta))
    return [f"data.root={root}", "data.verify_checksums=false"]


def _uneven_sizes(n: int, parts: int) -> np.ndarray:
    """``n`` split into ``parts`` sizes in proportion 1 : 2 : ... : parts (largest remainder; they sum to ``n``)."""
    quota = n * np.arange(1, parts + 1) / (parts * (parts + 1) / 2)
    sizes = np.floor(quota).astype(np.int64)
    sizes[np.argsort(sizes - quota, kind="stable")[: n - int(sizes.sum())]] += 1
    return sizes


def writer_ids(writers: int) -> list[str]:
    """TFF-style writer ids (``f0002_02``, ``f0001_01``, ...), created in reverse sorted order."""
    return [f"f{i:04d}_{i % 50:02d}" for i in reversed(range(writers))]


def write_femnist_h5(path: str | Path, sizes: dict[str, int], num_classes: int, rng: np.random.Generator) -> None:
    """One TFF FEMNIST file: ``examples/<id>/pixels`` (float32, 0..1) and ``examples/<id>/label`` (int32)."""
    import h5py

    with h5py.File(path, "w") as f:
        examples = f.create_group("examples")
        for cid, n in sizes.items():
            labels = cycled_labels(n, num_classes, rng).astype(np.int32)
            group = examples.create_group(cid)
            group["pixels"] = pattern_images(labels, num_classes, 28, 1, rng)[..., 0].astype(np.float32) / 255.0
            group["label"] = labels


def write_femnist_tff(
    root: str | Path, n_train: int = 60, n_test: int = 20, *, only_digits: bool = False, writers: int = 3, seed: int = 0
) -> list[str]:
    """Write ``root/fed_emnist[_digitsonly]_{train,test}.h5``: ``n_train`` / ``n_test`` examples over ``writers``
    (≥ 3) writers of uneven sizes, every writer in both files (it may have 0 test rows when ``n_test`` is
    small). Returns ``data.root`` (and ``data.only_digits=true``)."""
    if n_train < writers:
        raise ValueError(f"write_femnist_tff: n_train ({n_train}) must be ≥ writers ({writers}): each writer trains")
    rng = np.random.default_rng(seed)
    ids = writer_ids(writers)
    stem = "fed_emnist_digitsonly" if only_digits else "fed_emnist"
    Path(root).mkdir(parents=True, exist_ok=True)
    for part, n in (("train", n_train), ("test", n_test)):
        sizes = dict(zip(ids, (int(s) for s in _uneven_sizes(n, writers)), strict=True))
        write_femnist_h5(Path(root) / f"{stem}_{part}.h5", sizes, 10 if only_digits else 62, rng)
    return [f"data.root={root}"] + (["data.only_digits=true"] if only_digits else [])
