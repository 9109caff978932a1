"""Convolutional networks of McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks
from Decentralized Data" (AISTATS).

* :class:`McMahanCNN` — the paper's MNIST CNN: two 5x5 convolutions (32 then 64 channels), each
  followed by 2x2 max pooling, a 512-unit ReLU layer and a softmax output (here: logits). With
  ``padding=2`` ("SAME", as in the common TensorFlow implementation) 28x28 inputs reach the dense layer
  as 7x7x64, giving the paper's 1,663,370 parameters.
* :class:`CifarCNN` — the paper's CIFAR-10 model, which is the TensorFlow CIFAR-10 tutorial network:
  two 5x5/64 convolutions with 3x3 stride-2 max pooling and local response normalisation, then dense
  layers of 384 and 192 ReLU units and a linear output. The paper feeds 24x24 crops (about 10^6
  parameters: 1,068,298); on uncropped 32x32 images it has 1,756,426.

Neither uses BatchNorm; :class:`CNNBatchNorm` is the MNIST CNN with BatchNorm, for FedBN. Dense-layer
input sizes are computed from ``input_shape``.
"""

from __future__ import annotations

import torch
from torch import nn


def require_image_shape(input_shape: tuple[int, ...], model_name: str) -> tuple[int, int, int]:
    """Return ``input_shape`` as ``(C, H, W)``, or raise ValueError naming the config ``model_name``."""
    if len(input_shape) != 3:
        raise ValueError(
            f"model={model_name} needs image inputs (C, H, W) but the data gives {tuple(input_shape)}; "
            "use model=logreg or model=mlp"
        )
    c, h, w = (int(d) for d in input_shape)
    return c, h, w


def out_size(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """Spatial size after a convolution or pooling window (PyTorch's floor rule); the CNNs here size their dense
    layers with it."""
    return (size + 2 * padding - kernel) // stride + 1


def require_feature_map(sizes: tuple[int, int], input_shape: tuple[int, ...], model_name: str) -> None:
    """Raise a one-line ValueError naming ``model=<model_name>`` when the feature map ``sizes`` (height, width) has
    vanished, i.e. the images of ``input_shape`` are too small for the model."""
    if min(sizes) < 1:
        raise ValueError(f"model={model_name}: images of shape {tuple(input_shape)} are too small for it")


class McMahanCNN(nn.Module):
    """The MNIST CNN of McMahan et al. 2017; returns logits ``(B, num_classes)``.

    ``fc_units`` (default 512) is the width of the dense ReLU layer.
    """

    option_name = "cnn"  # the config option named in error messages

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, fc_units: int = 512) -> None:
        super().__init__()
        c, h, w = require_image_shape(input_shape, self.option_name)
        for _ in range(2):  # conv 5x5 'same' keeps the size; 2x2 pooling halves it
            h, w = out_size(h, 2, 2), out_size(w, 2, 2)
        require_feature_map((h, w), input_shape, self.option_name)
        self.features = nn.Sequential(
            nn.Conv2d(c, 32, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * h * w, fc_units),
            nn.ReLU(),
            nn.Linear(fc_units, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` → logits ``(B, num_classes)``."""
        return self.classifier(self.features(x))


class CNNBatchNorm(nn.Module):
    """:class:`McMahanCNN` with BatchNorm after each convolution, as in the digits CNN of FedBN (Li, Jiang, Zhang,
    Kamp, Dou, ICLR 2021): conv5x5(32)-BN-ReLU-pool → conv5x5(64)-BN-ReLU-pool → FC(``fc_units``)-ReLU → linear.
    Returns logits ``(B, num_classes)``.

    ``fc_batch_norm=True`` adds BatchNorm1d after the dense layer too, as that paper's CNN has; it is off by
    default because BatchNorm1d refuses, in training, a batch of one example, which a client's last batch is
    whenever its training examples are one more than a multiple of the batch size (the convolutions' BatchNorm
    has the feature map's positions as well, and no such limit). Convolutions and dense layers are built in
    :class:`McMahanCNN`'s order and BatchNorm draws nothing at initialisation, so with the same seed their
    initial weights are :class:`McMahanCNN`'s. ``executor=vmap`` cannot train BatchNorm: use ``executor=process``.
    """

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, fc_units: int = 512, fc_batch_norm: bool = False
    ) -> None:
        super().__init__()
        c, h, w = require_image_shape(input_shape, "cnn_bn")
        for _ in range(2):  # conv 5x5 'same' keeps the size; 2x2 pooling halves it
            h, w = out_size(h, 2, 2), out_size(w, 2, 2)
        require_feature_map((h, w), input_shape, "cnn_bn")
        self.features = nn.Sequential(
            nn.Conv2d(c, 32, kernel_size=5, padding=2),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=5, padding=2),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        dense_norm = [nn.BatchNorm1d(fc_units)] if fc_batch_norm else []
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * h * w, fc_units),
            *dense_norm,
            nn.ReLU(),
            nn.Linear(fc_units, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` → logits ``(B, num_classes)``."""
        return self.classifier(self.features(x))


def _tf_lrn() -> nn.LocalResponseNorm:
    """TensorFlow's ``lrn(depth_radius=4, bias=1, alpha=0.001/9, beta=0.75)`` in PyTorch terms.

    PyTorch divides ``alpha`` by the window size (9), so its ``alpha`` is 0.001.
    """
    return nn.LocalResponseNorm(size=9, alpha=0.001, beta=0.75, k=1.0)


class CifarCNN(nn.Module):
    """The CIFAR-10 CNN of McMahan et al. 2017 (TensorFlow tutorial model); returns logits.

    conv5x5(64)-ReLU-maxpool3x3/2-LRN → conv5x5(64)-ReLU-LRN-maxpool3x3/2 → FC(384)-ReLU →
    FC(192)-ReLU → linear. Convolutions and pools pad like TensorFlow's 'SAME' (32 → 16 → 8).
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        c, h, w = require_image_shape(input_shape, "cifar_cnn")
        for _ in range(2):
            h, w = out_size(h, 3, 2, 1), out_size(w, 3, 2, 1)
        require_feature_map((h, w), input_shape, "cifar_cnn")
        self.features = nn.Sequential(
            nn.Conv2d(c, 64, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
            _tf_lrn(),
            nn.Conv2d(64, 64, kernel_size=5, padding=2),
            nn.ReLU(),
            _tf_lrn(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * h * w, 384),
            nn.ReLU(),
            nn.Linear(384, 192),
            nn.ReLU(),
            nn.Linear(192, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` → logits ``(B, num_classes)``."""
        return self.classifier(self.features(x))
