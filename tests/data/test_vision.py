"""Loading MNIST, Fashion-MNIST, EMNIST and CIFAR-10 from tiny files written in the real formats."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds the vision_files helpers

import vision_files  # noqa: E402
from torchvision import datasets  # noqa: E402

from fedsim.data import vision  # noqa: E402
from fedsim.data.tensor_data import DataSplit  # noqa: E402

GRAY = {
    "mnist": (vision.mnist, "MNIST", vision.MNIST_MEAN, vision.MNIST_STD),
    "fashion_mnist": (vision.fashion_mnist, "FashionMNIST", vision.FASHION_MNIST_MEAN, vision.FASHION_MNIST_STD),
}


def _check_split(split: DataSplit, shape: tuple[int, ...], n: tuple[int, int], num_classes: int) -> None:
    for part, size in zip((split.train, split.test), n, strict=True):
        assert part.x.shape == (size, *shape) and part.x.dtype == torch.float32
        assert part.y.shape == (size,) and part.y.dtype == torch.int64
        assert part.num_classes == num_classes and part.input_shape == shape
        assert part.x.is_contiguous()


def _denormalise(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """Back to the 0..255 pixel scale (must come out as integers)."""
    view = (1, len(mean), 1, 1)
    return (x * torch.tensor(std).view(view) + torch.tensor(mean).view(view)) * 255


def _bright_cell(x: torch.Tensor, num_classes: int) -> np.ndarray:
    """Index of the brightest grid cell of each image (the label, by construction of the files)."""
    side = int(np.ceil(np.sqrt(num_classes)))
    cell = x.shape[-1] // side
    grid = x[..., : side * cell, : side * cell].mean(1)
    grid = grid.reshape(len(x), side, cell, side, cell).mean((2, 4))
    return grid.reshape(len(x), -1).argmax(1).numpy()


@pytest.mark.parametrize("name", sorted(GRAY))
def test_mnist_family_loads(tmp_path: Path, name: str) -> None:
    load, folder, mean, std = GRAY[name]
    vision_files.write_mnist(tmp_path, n_train=40, n_test=20, seed=1, folder=folder)
    split = load(root=tmp_path)
    _check_split(split, (1, 28, 28), (40, 20), 10)
    raw = datasets.MNIST if name == "mnist" else datasets.FashionMNIST
    expected = raw(str(tmp_path), train=True).data.float().unsqueeze(1)
    torch.testing.assert_close(_denormalise(split.train.x, mean, std), expected, atol=1e-3, rtol=0)
    assert sorted(split.train.y.tolist()) == sorted(list(range(10)) * 4)
    np.testing.assert_array_equal(_bright_cell(split.test.x, 10), split.test.y.numpy())


def test_mnist_normalisation_constants(tmp_path: Path) -> None:
    vision_files.write_mnist(tmp_path, n_train=10, n_test=10)
    x = vision.mnist(root=str(tmp_path)).train.x
    pixels = _denormalise(x, vision.MNIST_MEAN, vision.MNIST_STD)
    torch.testing.assert_close(pixels, pixels.round(), atol=1e-3, rtol=0)
    zero = (0 - 0.1307) / 0.3081
    assert x.min().item() == pytest.approx(zero, abs=1e-5)  # background noise includes 0


@pytest.mark.parametrize(("split_name", "num_classes", "low"), [("balanced", 47, 0), ("letters", 27, 1)])
def test_emnist_loads_upright(tmp_path: Path, split_name: str, num_classes: int, low: int) -> None:
    vision_files.write_emnist(tmp_path, split=split_name, n_train=2 * num_classes, n_test=num_classes)
    split = vision.emnist(root=tmp_path, split=split_name)
    _check_split(split, (1, 28, 28), (2 * num_classes, num_classes), num_classes)
    assert split.train.y.min().item() == low and split.train.y.max().item() == num_classes - 1
    # the files store images transposed; the loader turns them upright, so the bright cell is the label
    np.testing.assert_array_equal(_bright_cell(split.train.x, num_classes), split.train.y.numpy())


def test_emnist_unknown_split(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown split 'nope'"):
        vision.emnist(root=tmp_path, split="nope")


def test_cifar10_loads_without_checksums(tmp_path: Path) -> None:
    vision_files.write_cifar10(tmp_path, n_train=23, n_test=12)
    split = vision.cifar10(root=tmp_path, verify_checksums=False)
    _check_split(split, (3, 32, 32), (23, 12), 10)
    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "rb") as f:
        rows = pickle.load(f)["data"]  # (N, 3072) in CHW plane order
    expected = torch.from_numpy(rows).reshape(-1, 3, 32, 32).float()
    got = _denormalise(split.test.x, vision.CIFAR10_MEAN, vision.CIFAR10_STD)
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=0)
    np.testing.assert_array_equal(_bright_cell(split.test.x, 10), split.test.y.numpy())


def test_cifar10_checksum_mismatch_is_one_line(tmp_path: Path) -> None:
    vision_files.write_cifar10(tmp_path)
    with pytest.raises(vision.DatasetNotFoundError) as info:
        vision.cifar10(root=tmp_path)
    message = str(info.value)
    assert "\n" not in message and "md5" in message and "data.verify_checksums=false" in message
    assert str(tmp_path / "cifar-10-batches-py") in message


LOADERS = {
    "mnist": (vision.mnist, "MNIST/raw"),
    "fashion_mnist": (vision.fashion_mnist, "FashionMNIST/raw"),
    "emnist": (vision.emnist, "EMNIST/raw"),
    "cifar10": (vision.cifar10, "cifar-10-batches-py"),
}


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_absent_files_raise_one_line_error(tmp_path: Path, name: str) -> None:
    load, folder = LOADERS[name]
    with pytest.raises(vision.DatasetNotFoundError) as info:
        load(root=tmp_path)
    err = info.value
    assert isinstance(err, FileNotFoundError)
    message = str(err)
    assert "\n" not in message
    assert message.startswith(f"data={name}: ")
    assert str(tmp_path / folder) in message and "data.download" in message
    assert err.__cause__ is None and err.__suppress_context__  # torchvision's traceback is hidden


def test_partly_missing_files_are_named(tmp_path: Path) -> None:
    vision_files.write_mnist(tmp_path)
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(vision.DatasetNotFoundError, match="missing .*: t10k-labels-idx1-ubyte;"):
        vision.mnist(root=tmp_path)


def _no_network(*args: object, **kwargs: object) -> None:
    raise URLError("[Errno -2] Name or service not known")


@pytest.mark.parametrize("name", ["mnist", "cifar10", "emnist"])
def test_failed_download_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    for module in ("mnist", "cifar"):
        monkeypatch.setattr(f"torchvision.datasets.{module}.download_and_extract_archive", _no_network)
    load, folder = LOADERS[name]
    with pytest.raises(vision.DatasetNotFoundError) as info:
        load(root=tmp_path, download=True)
    message = str(info.value)
    assert "\n" not in message and "could not download" in message and "Name or service" in message
    assert str(tmp_path / folder) in message
    assert info.value.__suppress_context__


def test_download_skipped_when_files_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("torchvision.datasets.mnist.download_and_extract_archive", _no_network)
    vision_files.write_mnist(tmp_path, n_train=10, n_test=10)
    assert len(vision.mnist(root=tmp_path, download=True).train) == 10


def test_tiny_training_run_beats_chance(tmp_path: Path) -> None:
    vision_files.write_mnist(tmp_path, n_train=200, n_test=100, seed=3)
    split = vision.mnist(root=tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(30):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(split.train.x), split.train.y).backward()
        opt.step()
    accuracy = (model(split.test.x).argmax(1) == split.test.y).float().mean().item()
    assert accuracy > 0.5  # chance is 0.1
