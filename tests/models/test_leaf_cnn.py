"""LEAF's FEMNIST and CelebA CNNs: layer sizes as in LEAF's TensorFlow code, refused inputs, option files."""

from __future__ import annotations

import functools

import pytest
import torch
from hydra.utils import instantiate

from fedsim.cli.run import compose
from fedsim.client.base import Client
from fedsim.data.tensor_data import TensorData
from fedsim.executor import VmapExecutor, VmapUnsupportedError, Workload
from fedsim.models.leaf_cnn import CelebaCNN, FemnistCNN


def _num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_femnist_cnn_has_leafs_layers() -> None:
    """conv5x5/32 'same' → pool → conv5x5/64 'same' → pool → dense 2048 → dense 62, on 28x28 characters."""
    torch.manual_seed(0)
    model = FemnistCNN((1, 28, 28), 62)
    assert model(torch.rand(3, 1, 28, 28)).shape == (3, 62)
    assert model.classifier[1].in_features == 7 * 7 * 64 and model.classifier[1].out_features == 2048
    convs = (25 * 32 + 32) + (25 * 32 * 64 + 64)
    assert _num_params(model) == convs + (7 * 7 * 64 * 2048 + 2048) + (2048 * 62 + 62) == 6_603_710


def test_celeba_cnn_has_leafs_layers() -> None:
    """4 × [conv3x3/32 'same', BatchNorm, pool 'same', ReLU] → dense 2, on 84x84 RGB faces. TensorFlow's 'same'
    pooling rounds up: 84 → 42 → 21 → 11 → 6."""
    torch.manual_seed(0)
    model = CelebaCNN((3, 84, 84), 2)
    assert model(torch.rand(2, 3, 84, 84)).shape == (2, 2)
    assert model.classifier[1].in_features == 6 * 6 * 32
    convs = (9 * 3 * 32 + 32) + 3 * (9 * 32 * 32 + 32)
    assert _num_params(model) == convs + 4 * 2 * 32 + (6 * 6 * 32 * 2 + 2) == 31_202
    kinds = [type(m).__name__ for m in model.features[0]]
    assert kinds == ["Conv2d", "BatchNorm2d", "MaxPool2d", "ReLU"]


def test_celeba_pooling_keeps_the_last_odd_row() -> None:
    """On a 3x3 image one block pools to 2x2 (rounding up), the last row/column pooled alone."""
    model = CelebaCNN((1, 3, 3), 2, channels=1, blocks=1).eval()
    pool = model.features[0][2]
    x = torch.arange(9.0).view(1, 1, 3, 3)
    assert pool(x).tolist() == [[[[4.0, 5.0], [7.0, 8.0]]]]
    assert model(torch.rand(1, 1, 3, 3)).shape == (1, 2)


def test_femnist_cnn_takes_other_image_sizes() -> None:
    assert FemnistCNN((3, 32, 32), 10)(torch.rand(1, 3, 32, 32)).shape == (1, 10)
    assert FemnistCNN((1, 28, 28), 10, fc_units=16).classifier[1].out_features == 16


@pytest.mark.parametrize(("cls", "name"), [(FemnistCNN, "femnist_cnn"), (CelebaCNN, "celeba_cnn")])
def test_flat_inputs_are_refused(cls: type, name: str) -> None:
    with pytest.raises(ValueError, match=rf"model={name} needs image inputs \(C, H, W\) but the data gives \(784,\)"):
        cls((784,), 10)


def test_too_small_images_and_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"model=femnist_cnn: images of shape \(1, 3, 3\) are too small"):
        FemnistCNN((1, 3, 3), 10)
    with pytest.raises(ValueError, match=r"model=celeba_cnn: blocks and channels must be >= 1"):
        CelebaCNN((3, 84, 84), 2, blocks=0)


def test_vmap_refuses_the_celeba_cnn_at_start() -> None:
    """BatchNorm cannot be vectorised per client: executor=vmap says so before any training."""
    data = TensorData(torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 0, 1]), 2)
    workload = Workload(functools.partial(CelebaCNN, (3, 8, 8), 2), [Client(0, [0, 1, 2, 3])], data)
    expected = r"cannot train BatchNorm \(features.0.1: BatchNorm2d\).*executor=process"
    with pytest.raises(VmapUnsupportedError, match=expected):
        VmapExecutor().check(workload)


@pytest.mark.parametrize(
    ("option", "cls", "shape"), [("femnist_cnn", FemnistCNN, (1, 28, 28)), ("celeba_cnn", CelebaCNN, (3, 84, 84))]
)
def test_option_files_build_the_models(option: str, cls: type, shape: tuple[int, ...]) -> None:
    model = instantiate(compose([f"model={option}"]).model)(input_shape=shape, num_classes=62)
    assert type(model) is cls
