"""ResNet-18 (He et al. 2016, "Deep Residual Learning for Image Recognition") with GroupNorm in place
of BatchNorm, as proposed for non-IID federated training by Hsieh et al. 2020, "The Non-IID Data
Quagmire of Decentralized Machine Learning" (ICML): BatchNorm's running statistics break when each
client's batches come from a different label distribution, GroupNorm has no batch statistics.

The stem is the CIFAR-style 3x3 stride-1 convolution without max pooling (as in He et al.'s CIFAR
experiments and most federated CIFAR-10 baselines); global average pooling makes any H, W work.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from fedsim.models.cnn import require_image_shape

_WIDTHS = (64, 128, 256, 512)


def _conv3x3(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlockGN(nn.Module):
    """Two 3x3 convolutions with GroupNorm and a (projected when the shape changes) shortcut."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, num_groups: int) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_ch, out_ch, stride)
        self.norm1 = nn.GroupNorm(num_groups, out_ch)
        self.conv2 = _conv3x3(out_ch, out_ch)
        self.norm2 = nn.GroupNorm(num_groups, out_ch)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, kernel_size=1, stride=stride, bias=False),
                nn.GroupNorm(num_groups, out_ch),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18GN(nn.Module):
    """ResNet-18 with GroupNorm(``num_groups``) after every convolution; returns logits.

    ``num_groups`` (default 2, the setting of Hsieh et al. 2020) must divide 64. Four stages of two
    basic blocks (64, 128, 256, 512 channels; the last three stride 2), global average pooling and a
    linear classifier: 11,173,962 parameters for 3x32x32 inputs and 10 classes.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_groups: int = 2) -> None:
        super().__init__()
        channels = require_image_shape(input_shape, "resnet18")[0]
        if num_groups < 1 or _WIDTHS[0] % num_groups:
            raise ValueError(f"model=resnet18: num_groups={num_groups} must be a positive divisor of 64")
        self.stem = nn.Sequential(_conv3x3(channels, 64), nn.GroupNorm(num_groups, 64), nn.ReLU())
        blocks: list[nn.Module] = []
        in_ch = 64
        for stage, width in enumerate(_WIDTHS):
            stride = 1 if stage == 0 else 2
            blocks.append(BasicBlockGN(in_ch, width, stride, num_groups))
            blocks.append(BasicBlockGN(width, width, 1, num_groups))
            in_ch = width
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` → logits ``(B, num_classes)``."""
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))
