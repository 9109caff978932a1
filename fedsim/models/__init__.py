"""Plain ``nn.Module`` models. Every constructor takes ``input_shape`` and ``num_classes``."""

from fedsim.models.cnn import CifarCNN, CNNBatchNorm, McMahanCNN
from fedsim.models.emnist_cnn import EmnistCNN
from fedsim.models.leaf_cnn import CelebaCNN, FemnistCNN
from fedsim.models.linear import LogisticRegression
from fedsim.models.mlp import MLP2NN
from fedsim.models.resnet import ResNet18GN
from fedsim.models.text import BagOfWords, CharLSTM, SentimentLSTM

__all__ = [
    "BagOfWords",
    "CelebaCNN",
    "CharLSTM",
    "CifarCNN",
    "CNNBatchNorm",
    "EmnistCNN",
    "FemnistCNN",
    "LogisticRegression",
    "MLP2NN",
    "McMahanCNN",
    "ResNet18GN",
    "SentimentLSTM",
]
