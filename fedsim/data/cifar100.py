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

from pathlib import Path

from torchvision import datasets

from fedsim.core.errors import DatasetNotFoundError
from fedsim.data.pachinko import CIFAR100_COARSE_OF
from fedsim.data.tensor_data import DataSplit
from fedsim.data.vision import read_cifar

__all__ = ["CIFAR100_COARSE_OF", "CIFAR100_MEAN", "CIFAR100_STD", "DatasetNotFoundError", "cifar100"]

CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)


def cifar100(*, root: str | Path, download: bool = False, verify_checksums: bool = True) -> DataSplit:
    """CIFAR-100 (50k / 10k, 100 fine classes) from ``root/cifar-100-python``; see the module docstring.

    With ``verify_checksums=True`` (the default) every file must have the official md5; ``False`` reads
    any files in the same pickle format. The reader is CIFAR-10's (:func:`fedsim.data.vision.read_cifar`).
    """
    return read_cifar(
        datasets.CIFAR100,
        name="cifar100",
        title="CIFAR-100",
        what="the extracted cifar-100-python.tar.gz (the cifar-100-python folder, from "
        "https://www.cs.toronto.edu/~kriz/cifar.html)",
        root=root,
        download=download,
        verify_checksums=verify_checksums,
        mean=CIFAR100_MEAN,
        std=CIFAR100_STD,
    )
