"""The "2NN" of McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from
Decentralized Data" (AISTATS): a multilayer perceptron with two hidden layers of 200 units and ReLU
activations (199,210 parameters on 784-pixel MNIST).
"""

from __future__ import annotations

import math

import torch
from torch import nn


class MLP2NN(nn.Module):
    """Flatten → Linear(hidden) → ReLU → Linear(hidden) → ReLU → Linear(num_classes); returns logits.

    ``hidden`` (default 200, as in the paper) sets the width of both hidden layers. Any
    ``input_shape`` works; it is flattened.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: int = 200) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(math.prod(input_shape), hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, *input_shape)`` → logits ``(B, num_classes)``."""
        return self.layers(x)
