"""Shapes, parameter counts, input checks and trainability of the fedsim models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedsim.models import MLP2NN, CifarCNN, LogisticRegression, McMahanCNN, ResNet18GN
from fedsim.models.emnist_cnn import EmnistCNN

MNIST = (1, 28, 28)
CIFAR = (3, 32, 32)

CASES = [
    (LogisticRegression, (60,)),
    (LogisticRegression, MNIST),
    (MLP2NN, (60,)),
    (MLP2NN, MNIST),
    (MLP2NN, CIFAR),
    (McMahanCNN, MNIST),
    (McMahanCNN, CIFAR),
    (CifarCNN, CIFAR),
    (CifarCNN, MNIST),
    (ResNet18GN, CIFAR),
    (ResNet18GN, MNIST),
    (EmnistCNN, MNIST),
    (EmnistCNN, CIFAR),
]


def _num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(("cls", "shape"), CASES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_output_shape(cls: type[nn.Module], shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = cls(shape, 7)
    out = model(torch.randn(3, *shape))
    assert out.shape == (3, 7) and out.dtype == torch.float32


@pytest.mark.parametrize(
    ("cls", "shape", "expected"),
    [
        (LogisticRegression, MNIST, 784 * 10 + 10),
        (LogisticRegression, (60,), 60 * 10 + 10),
        (MLP2NN, MNIST, 199_210),  # McMahan et al. 2017, 2NN on MNIST
        (McMahanCNN, MNIST, 1_663_370),  # McMahan et al. 2017, CNN on MNIST
        (CifarCNN, (3, 24, 24), 1_068_298),  # the paper's 24x24 crops: "about 10^6"
        (CifarCNN, CIFAR, 1_756_426),
        (ResNet18GN, CIFAR, 11_173_962),
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_parameter_counts(cls: type[nn.Module], shape: tuple[int, ...], expected: int) -> None:
    assert _num_params(cls(shape, 10)) == expected


def test_emnist_cnn_has_reddi_et_al_parameter_count() -> None:
    assert _num_params(EmnistCNN(MNIST, 62)) == 1_206_590  # Reddi et al. 2021, EMNIST CR CNN (62 classes)


def test_mcmahan_cnn_dense_input_is_computed() -> None:
    assert McMahanCNN(MNIST, 10).classifier[1].in_features == 7 * 7 * 64
    assert McMahanCNN(CIFAR, 10).classifier[1].in_features == 8 * 8 * 64
    assert CifarCNN(CIFAR, 10).classifier[1].in_features == 8 * 8 * 64


@pytest.mark.parametrize(
    ("cls", "name"), [(McMahanCNN, "cnn"), (CifarCNN, "cifar_cnn"), (ResNet18GN, "resnet18"), (EmnistCNN, "emnist_cnn")]
)
def test_image_models_reject_flat_inputs(cls: type[nn.Module], name: str) -> None:
    expected = f"model={name} needs image inputs (C, H, W) but the data gives (60,); use model=logreg or model=mlp"
    with pytest.raises(ValueError) as info:
        cls((60,), 10)
    assert str(info.value) == expected


def test_too_small_images_are_rejected() -> None:
    with pytest.raises(ValueError, match="model=cnn: images of shape"):
        McMahanCNN((1, 3, 3), 10)


def test_resnet_num_groups() -> None:
    model = ResNet18GN(CIFAR, 10, num_groups=4)
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert norms and all(m.num_groups == 4 for m in norms)
    assert all(m.num_groups == 2 for m in ResNet18GN(CIFAR, 10).modules() if isinstance(m, nn.GroupNorm))
    with pytest.raises(ValueError, match="num_groups=3"):
        ResNet18GN(CIFAR, 10, num_groups=3)


@pytest.mark.parametrize(("cls", "shape"), CASES[1::2] + [(ResNet18GN, CIFAR)], ids=str)
def test_no_batchnorm_and_float_buffers_only(cls: type[nn.Module], shape: tuple[int, ...]) -> None:
    model = cls(shape, 10)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert all(b.is_floating_point() for b in model.buffers())


def test_resnet_forward_backward() -> None:
    torch.manual_seed(0)
    model = ResNet18GN(CIFAR, 10)
    loss = nn.functional.cross_entropy(model(torch.randn(2, *CIFAR)), torch.tensor([1, 7]))
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize(
    ("cls", "shape", "lr"),
    [
        (LogisticRegression, (60,), 0.1),
        (MLP2NN, MNIST, 0.1),
        (McMahanCNN, MNIST, 0.05),
        (CifarCNN, CIFAR, 0.05),
        (ResNet18GN, (3, 8, 8), 0.001),  # small images keep it fast; larger steps overshoot here
    ],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_sgd_steps_reduce_loss(cls: type[nn.Module], shape: tuple[int, ...], lr: float) -> None:
    torch.manual_seed(0)
    model = cls(shape, 4)
    x, y = torch.randn(4, *shape), torch.arange(4)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
