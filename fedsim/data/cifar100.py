"""CIFAR-100 read with torchvision into in-memory :class:`DataSplit` tensors (as ``fedsim.data.vision`` does CIFAR-10).

Krizhevsky, "Learning Multiple Layers of Features from Tiny Images", 2009; files from
https://www.cs.toronto.edu/~kriz/cifar.html (``cifar-100-python.tar.gz``). Expected under ``root``:
``cifar-100-python/{train,test,meta}`` (python pickles; ``download=True`` fetches and extracts them).

* ``x``: float32 ``(N, 3, 32, 32)``, ``(x / 255 - mean) / std`` per channel with the CIFAR-100
  training-set pixel statistics on the 0..1 scale: mean ``(0.5071, 0.4865, 0.4409)``, std
  ``(0.2673, 0.2564, 0.2762)`` (the values commonly used for CIFAR-100: per channel, the mean and
  standard deviation of all 50,000 × 32 × 32 training pixels, rounded to 4 decimals).
* ``y``: the 100 **fine** labels (int64); ``num_classes`` is 100. The pickles also hold
  ``coarse_labels`` (the 20 superclasses); they are a fixed function of the fine label,
  :data:`CIFAR100_COARSE_OF`, which the Pachinko partition (``partition=pachinko``) uses.

torchvision accepts the files only when their md5 matches the official release; ``verify_checksums=False``
reads files that merely exist (re-packed copies, test fixtures). Missing or unusable files raise
:class:`~fedsim.core.errors.DatasetNotFoundError` with a one-line message.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torchvision import datasets

from fedsim.data.pachinko import CIFAR100_COARSE_OF
from fedsim.data.tensor_data import DataSplit
from fedsim.data.vision import DatasetNotFoundError, _open, _Source, _to_tensor_data

__all__ = ["CIFAR100_COARSE_OF", "CIFAR100_MEAN", "CIFAR100_STD", "DatasetNotFoundError", "cifar100"]

CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)


class _UncheckedCIFAR100(datasets.CIFAR100):
    """torchvision's CIFAR-100 reader with the md5 checks dropped: the files need only exist."""

    train_list = [[name, None] for name, _ in datasets.CIFAR100.train_list]
    test_list = [[name, None] for name, _ in datasets.CIFAR100.test_list]
    meta = {**datasets.CIFAR100.meta, "md5": None}


def _cifar100_source(root: str, verify_checksums: bool) -> _Source:
    """Source for CIFAR-100; ``verify_checksums=False`` swaps in :class:`_UncheckedCIFAR100`."""
    base = os.path.expanduser(root)
    cls = datasets.CIFAR100 if verify_checksums else _UncheckedCIFAR100
    listed = datasets.CIFAR100.train_list + datasets.CIFAR100.test_list
    md5 = dict(listed) | {cls.meta["filename"]: cls.meta["md5"]} if verify_checksums else {}
    return _Source(
        name="cifar100",
        title="CIFAR-100",
        folder=os.path.join(base, cls.base_folder),
        files=tuple(name for name, _ in listed) + (cls.meta["filename"],),
        what="the extracted cifar-100-python.tar.gz (the cifar-100-python folder, from https://www.cs.toronto.edu/~kriz/cifar.html)",
        make=lambda train, download: cls(base, train=train, download=download),
        md5=md5,
    )


def cifar100(*, root: str | Path, download: bool = False, verify_checksums: bool = True) -> DataSplit:
    """CIFAR-100 (50k / 10k, 100 fine classes) from ``root/cifar-100-python``; see the module docstring.

    With ``verify_checksums=True`` (the default) every file must have the official md5; ``False`` reads
    any files in the same pickle format.
    """
    src = _cifar100_source(str(root), verify_checksums)
    parts = []
    for train in (True, False):
        ds = _open(src, train, download and train)
        images = torch.from_numpy(np.ascontiguousarray(ds.data)).permute(0, 3, 1, 2)
        parts.append(_to_tensor_data(images, ds.targets, len(ds.classes), CIFAR100_MEAN, CIFAR100_STD))
    return DataSplit(train=parts[0], test=parts[1])
