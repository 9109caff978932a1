"""The EMNIST character-recognition CNN of Reddi et al., "Adaptive Federated Optimization", ICLR 2021 (their
"EMNIST CR" task, Table 4 of the appendix; the model of google-research/federated's ``create_conv_dropout_model``).

Two 3x3 convolutions without padding (32 then 64 channels, ReLU), 2x2 max pooling, dropout 0.25, a 128-unit ReLU
layer, dropout 0.5 and the output layer (logits). On 28x28 inputs the dense layer sees 12x12x64 features and the
model has 1,206,590 parameters for 62 classes. Dropout draws from torch's global RNG, which fedsim seeds from the
task seed, so runs stay bitwise reproducible under every executor.
"""

from __future__ import annotations

import torch
from torch import nn

from fedsim.models.cnn import out_size, require_feature_map, require_image_shape


class EmnistCNN(nn.Module):
    """Reddi et al.'s EMNIST CNN; returns logits ``(B, num_classes)``. ``dropout=False`` drops both dropout layers."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, dropout: bool = True) -> None:
        super().__init__()
        c, h, w = require_image_shape(input_shape, "emnist_cnn")
        h, w = out_size(out_size(h, 3), 3) // 2, out_size(out_size(w, 3), 3) // 2
        require_feature_map((h, w), input_shape, "emnist_cnn")
        self.features = nn.Sequential(
            nn.Conv2d(c, 32, kernel_size=3),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(0.25 if dropout else 0.0),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * h * w, 128),
            nn.ReLU(),
            nn.Dropout(0.5 if dropout else 0.0),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
