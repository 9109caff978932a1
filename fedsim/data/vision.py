"""Image datasets read with torchvision and turned once into in-memory :class:`DataSplit` tensors.

Each loader lets the real torchvision dataset class find, check and parse the files, then takes its
``.data`` / ``.targets`` attributes (no per-sample PIL transforms) and converts them in one go:

* ``x``: float32, ``(x / 255 - mean) / std`` per channel; shape ``(N, 1, 28, 28)`` for the MNIST
  family and ``(N, 3, 32, 32)`` for CIFAR-10 (torchvision's NHWC uint8 array is permuted to NCHW).
* ``y``: int64 class indices; ``num_classes`` is the length of the dataset's class list.

Normalisation constants (training-set pixel statistics on the 0..1 scale):

=============  ==========================  ==========================
dataset        mean                        std
=============  ==========================  ==========================
MNIST          0.1307                      0.3081
Fashion-MNIST  0.2860                      0.3530
EMNIST         0.1751                      0.3332   (balanced split; used for every split)
CIFAR-10       (0.4914, 0.4822, 0.4465)    (0.2470, 0.2435, 0.2616)
=============  ==========================  ==========================

File layout expected under ``root`` (what torchvision reads; ``download=True`` creates it):

* MNIST: ``MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte`` (uncompressed IDX files).
* Fashion-MNIST: the same names under ``FashionMNIST/raw/``.
* EMNIST: ``EMNIST/raw/emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte``. The EMNIST
  files store every image transposed; the loader transposes them back so that they are upright
  like MNIST.
* CIFAR-10: ``cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}`` (python pickles).
  torchvision accepts these only when their md5 matches the official release; ``cifar10(...,
  verify_checksums=False)`` reads files that merely exist (re-packed copies, test fixtures).

Missing or unusable files raise :class:`DatasetNotFoundError` with a one-line message that names the
dataset, the directory looked in and how to get the files; torchvision's traceback is suppressed.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torchvision import datasets
from torchvision.datasets.utils import check_integrity

from fedsim.core.errors import DatasetNotFoundError  # noqa: F401 (defined there, without torchvision; re-exported)
from fedsim.data.reading import one_line
from fedsim.data.tensor_data import DataSplit, TensorData

MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)
EMNIST_MEAN, EMNIST_STD = (0.1751,), (0.3332,)
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)

_DOWNLOAD_HINT = "rerun with data.download=true on a machine with internet"


@dataclass(frozen=True)
class _Source:
    """Where one dataset lives on disk and how to open it with torchvision.

    ``make(train, download)`` builds the torchvision dataset; ``files`` are the names torchvision needs
    in ``folder``; ``md5`` gives the checksums torchvision insists on (empty when it checks none).
    """

    name: str
    title: str
    folder: str
    files: tuple[str, ...]
    what: str
    make: Callable[[bool, bool], datasets.VisionDataset]
    md5: dict[str, str] = field(default_factory=dict)


def _files_problem(src: _Source) -> str:
    """Say what is wrong with the files in ``src.folder`` and how to fix it ("" when nothing visibly is)."""
    remedy = f"{_DOWNLOAD_HINT}, or copy {src.what} there"
    missing = [f for f in src.files if not os.path.isfile(os.path.join(src.folder, f))]
    if len(missing) == len(src.files):
        return f"no {src.title} files under {src.folder}; {remedy}"
    if missing:
        return f"{src.title} files missing under {src.folder}: {', '.join(missing)}; {remedy}"
    bad = [f for f, md5 in src.md5.items() if not check_integrity(os.path.join(src.folder, f), md5)]
    if bad:
        return (
            f"{', '.join(bad)} under {src.folder} do not match the official {src.title} md5 checksums "
            "(corrupt or not the original release); delete them and rerun with data.download=true, "
            "or pass data.verify_checksums=false to read them anyway"
        )
    return ""


def _not_found(src: _Source, err: BaseException) -> DatasetNotFoundError:
    """The one-line error for files that torchvision refused to read."""
    problem = _files_problem(src) or f"cannot read {src.title} under {src.folder} ({one_line(err)})"
    return DatasetNotFoundError(f"data={src.name}: {problem}")


def _download_failed(src: _Source, err: BaseException) -> DatasetNotFoundError:
    """The one-line error for a download that did not work (typically: no network)."""
    return DatasetNotFoundError(
        f"data={src.name}: could not download {src.title} into {src.folder} "
        f"({type(err).__name__}: {one_line(err)}); without internet, copy {src.what} there "
        "from a machine that has it and rerun with data.download=false"
    )


def _damaged(src: _Source, err: BaseException) -> DatasetNotFoundError:
    """The one-line error for a pickle that torchvision could not read (CIFAR's files: truncated by an interrupted
    download or copy), naming the first of ``src.files`` that does not unpickle (only read again to find it)."""
    where = src.folder
    for name in src.files:
        path = os.path.join(src.folder, name)
        try:
            with open(path, "rb") as handle:
                pickle.load(handle, encoding="latin1")  # as torchvision reads them
        except Exception:  # any failure: this is the damaged file
            where = path
            break
    return DatasetNotFoundError(
        f"data={src.name}: cannot read {where} ({type(err).__name__}: {one_line(err)}); the file is truncated or "
        f"damaged: delete it and download it again ({_DOWNLOAD_HINT}), or copy {src.what} there"
    )


def _open(src: _Source, train: bool, download: bool) -> datasets.VisionDataset:
    """Build the torchvision dataset, turning its failures into :class:`DatasetNotFoundError`."""
    try:
        return src.make(train, download)
    except (pickle.UnpicklingError, EOFError) as err:  # a truncated pickle: "pickle data was truncated"
        raise _damaged(src, err) from None
    except OSError as err:  # network failures while downloading (URLError is an OSError)
        if not download:
            raise
        raise _download_failed(src, err) from None
    except RuntimeError as err:  # "Dataset not found or corrupted", or MNIST's failed-download report
        if download and _files_problem(src):
            raise _download_failed(src, err) from None
        raise _not_found(src, err) from None


def _normalise(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 NCHW images → float32 ``(x / 255 - mean) / std`` with per-channel constants."""
    shape = (1, len(mean), 1, 1)
    x = images.to(torch.float32).div_(255.0)
    x.sub_(torch.tensor(mean, dtype=torch.float32).view(shape))
    return x.div_(torch.tensor(std, dtype=torch.float32).view(shape)).contiguous()


def _to_tensor_data(
    images: torch.Tensor, targets: object, num_classes: int, mean: Sequence[float], std: Sequence[float]
) -> TensorData:
    """Wrap uint8 NCHW ``images`` and integer ``targets`` as normalised :class:`TensorData`."""
    y = torch.as_tensor(np.asarray(targets), dtype=torch.int64).reshape(-1)
    return TensorData(x=_normalise(images, mean, std), y=y, num_classes=num_classes)


def _load_gray(
    src: _Source, download: bool, mean: Sequence[float], std: Sequence[float], transpose: bool = False
) -> DataSplit:
    """Load an MNIST-family dataset: ``.data`` is ``(N, 28, 28)`` uint8, ``.targets`` int64."""
    parts = []
    for train in (True, False):
        ds = _open(src, train, download and train)
        images = ds.data.transpose(1, 2) if transpose else ds.data
        parts.append(_to_tensor_data(images.unsqueeze(1), ds.targets, len(ds.classes), mean, std))
    return DataSplit(train=parts[0], test=parts[1])


def _mnist_source(name: str, cls: type[datasets.MNIST], root: str) -> _Source:
    """Source for MNIST or Fashion-MNIST (the class name is also the folder name under ``root``)."""
    base = os.path.expanduser(str(root))
    files = tuple(os.path.splitext(os.path.basename(url))[0] for url, _ in cls.resources)
    return _Source(
        name=name,
        title=cls.__name__,
        folder=os.path.join(base, cls.__name__, "raw"),
        files=files,
        what=f"the {cls.__name__} IDX files (uncompressed)",
        make=lambda train, download: cls(base, train=train, download=download),
    )


def mnist(*, root: str | Path, download: bool = False) -> DataSplit:
    """MNIST (60k train / 10k test, 10 classes) from ``root/MNIST/raw``; see the module docstring."""
    return _load_gray(_mnist_source("mnist", datasets.MNIST, str(root)), download, MNIST_MEAN, MNIST_STD)


def fashion_mnist(*, root: str | Path, download: bool = False) -> DataSplit:
    """Fashion-MNIST (60k / 10k, 10 classes) from ``root/FashionMNIST/raw``."""
    src = _mnist_source("fashion_mnist", datasets.FashionMNIST, str(root))
    return _load_gray(src, download, FASHION_MNIST_MEAN, FASHION_MNIST_STD)


def _emnist_source(root: str, split: str) -> _Source:
    """Source for one EMNIST split (files ``emnist-<split>-<part>-<kind>-ubyte`` in ``EMNIST/raw``)."""
    base = os.path.expanduser(root)
    files = tuple(
        f"emnist-{split}-{part}-{kind}-ubyte" for part in ("train", "test") for kind in ("images-idx3", "labels-idx1")
    )
    return _Source(
        name="emnist",
        title=f"EMNIST ({split} split)",
        folder=os.path.join(base, "EMNIST", "raw"),
        files=files,
        what="the EMNIST IDX files (unzipped from gzip.zip)",
        make=lambda train, download: datasets.EMNIST(base, split=split, train=train, download=download),
    )


def emnist(*, root: str | Path, split: str = "balanced", download: bool = False) -> DataSplit:
    """EMNIST ``split`` from ``root/EMNIST/raw``, images transposed upright.

    ``num_classes`` is the size of the split's class list: 47 for balanced/bymerge, 62 for byclass,
    10 for digits/mnist, and 27 for letters (whose labels run 1..26; class 0 is unused).
    Downloading fetches the whole 560 MB archive with every split.
    """
    if split not in datasets.EMNIST.splits:
        choices = ", ".join(datasets.EMNIST.splits)
        raise ValueError(f"data=emnist: unknown split {split!r}; use one of {choices}")
    return _load_gray(_emnist_source(str(root), split), download, EMNIST_MEAN, EMNIST_STD, transpose=True)


def _unchecked(cls: type[datasets.CIFAR10]) -> type[datasets.CIFAR10]:
    """``cls`` (torchvision's ``CIFAR10`` or its subclass ``CIFAR100``) with the md5 checks dropped: the files need
    only exist."""
    lists = {key: [[file, None] for file, _ in getattr(cls, key)] for key in ("train_list", "test_list")}
    return type(f"Unchecked{cls.__name__}", (cls,), {**lists, "meta": {**cls.meta, "md5": None}})


def _cifar_source(cls: type[datasets.CIFAR10], name: str, title: str, what: str, root: str, verify: bool) -> _Source:
    """Source for a dataset in CIFAR's format; ``verify=False`` reads with :func:`_unchecked` ``cls``."""
    base = os.path.expanduser(root)
    reader = cls if verify else _unchecked(cls)
    listed = cls.train_list + cls.test_list
    md5 = dict(listed) | {cls.meta["filename"]: cls.meta["md5"]} if verify else {}
    return _Source(
        name=name,
        title=title,
        folder=os.path.join(base, cls.base_folder),
        files=tuple(file for file, _ in listed) + (cls.meta["filename"],),
        what=what,
        make=lambda train, download: reader(base, train=train, download=download),
        md5=md5,
    )


def read_cifar(
    cls: type[datasets.CIFAR10],
    *,
    name: str,
    title: str,
    what: str,
    root: str | Path,
    download: bool,
    verify_checksums: bool,
    mean: Sequence[float],
    std: Sequence[float],
) -> DataSplit:
    """A dataset in CIFAR's python-pickle format, read by torchvision's ``cls`` (``datasets.CIFAR10`` or
    ``datasets.CIFAR100``) from ``root/<cls.base_folder>``: the uint8 NHWC images permuted to NCHW and normalised
    with the per-channel ``mean`` and ``std``, the labels as int64, ``num_classes`` the length of the class list.

    ``name`` is the config option that messages name (``data=<name>``), ``title`` the dataset's name and ``what``
    the files to copy there; ``verify_checksums`` as :func:`cifar10` says. :func:`cifar10` and
    :func:`fedsim.data.cifar100.cifar100` are this reader with their own constants."""
    src = _cifar_source(cls, name, title, what, str(root), verify_checksums)
    parts = []
    for train in (True, False):
        ds = _open(src, train, download and train)
        images = torch.from_numpy(np.ascontiguousarray(ds.data)).permute(0, 3, 1, 2)
        parts.append(_to_tensor_data(images, ds.targets, len(ds.classes), mean, std))
    return DataSplit(train=parts[0], test=parts[1])


def cifar10(*, root: str | Path, download: bool = False, verify_checksums: bool = True) -> DataSplit:
    """CIFAR-10 (50k / 10k, 10 classes) from ``root/cifar-10-batches-py``.

    With ``verify_checksums=True`` (the default) torchvision's own check applies: every batch file
    must have the official md5. ``False`` reads any files in the same pickle format.
    """
    return read_cifar(
        datasets.CIFAR10,
        name="cifar10",
        title="CIFAR-10",
        what="the extracted cifar-10-python.tar.gz (the cifar-10-batches-py folder)",
        root=root,
        download=download,
        verify_checksums=verify_checksums,
        mean=CIFAR10_MEAN,
        std=CIFAR10_STD,
    )
