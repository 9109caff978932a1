"""Multinomial logistic regression: the convex baseline of the federated-optimisation literature.

Used e.g. on MNIST and the Synthetic(alpha, beta) data by Li et al. 2020, "Federated Optimization in
Heterogeneous Networks" (FedProx), and by McMahan et al. 2017 as the simplest model.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class LogisticRegression(nn.Module):
    """One linear layer from the flattened input to ``num_classes`` logits (softmax lives in the loss).

    Any ``input_shape`` works: ``(60,)`` for Synthetic, ``(1, 28, 28)`` for MNIST (784 inputs), ...
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear = nn.Linear(math.prod(input_shape), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, *input_shape)`` → logits ``(B, num_classes)``."""
        return self.linear(self.flatten(x))
