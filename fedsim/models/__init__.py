"""Plain ``nn.Module`` models. Every constructor takes ``input_shape`` and ``num_classes``."""

from fedsim.models.cnn import CifarCNN, CNNBatchNorm, McMahanCNN
from fedsim.models.linear import LogisticRegression
from fedsim.models.mlp import MLP2NN
from fedsim.models.resnet import ResNet18GN

__all__ = ["CifarCNN", "CNNBatchNorm", "LogisticRegression", "MLP2NN", "McMahanCNN", "ResNet18GN"]
