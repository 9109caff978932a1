"""The CNNs of the LEAF benchmark (Caldas et al. 2018, "LEAF: A Benchmark for Federated Settings",
https://github.com/TalwalkarLab/leaf), translated from its TensorFlow code layer by layer.

* :class:`FemnistCNN` — ``models/femnist/cnn.py``: conv 5x5/32 'same' + ReLU, 2x2 max pooling, conv 5x5/64 'same'
  + ReLU, 2x2 max pooling, dense 2048 + ReLU, dense ``num_classes`` (62 for FEMNIST). On 1x28x28 images with 62
  classes it has 6,603,710 parameters.
* :class:`CelebaCNN` — ``models/celeba/cnn.py``: four blocks of [conv 3x3/32 'same', batch normalisation, 2x2 max
  pooling 'same', ReLU], then dense ``num_classes`` (2: smiling or not). TensorFlow's 'same' pooling rounds up
  (84 → 42 → 21 → 11 → 6), which is PyTorch's ``ceil_mode=True``; on 3x84x84 images with 2 classes it has 31,202
  parameters.

Differences from LEAF: LEAF's CelebA model normalises with batch statistics at test time too
(``training=True``); here evaluation uses the running statistics, as PyTorch's BatchNorm does. Initialisation is
PyTorch's default, not TensorFlow's. ``executor=vmap`` cannot train BatchNorm: use ``executor=process`` for CelebA.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from fedsim.models.cnn import McMahanCNN, require_image_shape


def _pooled(size: int, times: int, ceil: bool) -> int:
    """Spatial size after ``times`` 2x2 stride-2 poolings (rounding up for TensorFlow's 'same' padding)."""
    for _ in range(times):
        size = math.ceil(size / 2) if ceil else size // 2
    return size


class FemnistCNN(McMahanCNN):
    """LEAF's FEMNIST CNN; returns logits ``(B, num_classes)``. It is McMahan et al.'s MNIST CNN
    (:class:`~fedsim.models.cnn.McMahanCNN`) with a dense layer of ``fc_units`` = 2048. Needs images ``(C, H, W)``
    of at least 4x4 pixels."""

    option_name = "femnist_cnn"

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, fc_units: int = 2048) -> None:
        super().__init__(input_shape, num_classes, fc_units)


def _celeba_block(in_channels: int, channels: int) -> nn.Sequential:
    """conv 3x3 'same' → BatchNorm → 2x2 max pooling (rounding up) → ReLU, in LEAF's order."""
    return nn.Sequential(
        nn.Conv2d(in_channels, channels, kernel_size=3, padding=1),
        nn.BatchNorm2d(channels),
        nn.MaxPool2d(2, ceil_mode=True),
        nn.ReLU(),
    )


class CelebaCNN(nn.Module):
    """LEAF's CelebA CNN; returns logits ``(B, num_classes)``. ``channels`` (default 32) is every convolution's
    width, ``blocks`` (default 4) the number of conv-BN-pool-ReLU blocks. Any image size ``(C, H, W)`` works
    (LEAF's is 3x84x84); the dense layer's input is computed from it."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, channels: int = 32, blocks: int = 4) -> None:
        super().__init__()
        c, h, w = require_image_shape(input_shape, "celeba_cnn")
        if blocks < 1 or channels < 1:
            raise ValueError(f"model=celeba_cnn: blocks and channels must be >= 1 (got {blocks}, {channels})")
        self.features = nn.Sequential(*(_celeba_block(c if i == 0 else channels, channels) for i in range(blocks)))
        h, w = _pooled(h, blocks, ceil=True), _pooled(w, blocks, ceil=True)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(channels * h * w, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` → logits ``(B, num_classes)``."""
        return self.classifier(self.features(x))
