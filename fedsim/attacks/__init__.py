"""Adversarial clients for evaluating robust aggregation (docs/attacks.md).

Configured by ``attack=<option>`` (``conf/attack/``); your own attack: subclass :class:`Attack`.
"""

from fedsim.attacks.base import Attack
from fedsim.attacks.data_poisoning import Backdoor, DataAttack, LabelFlip
from fedsim.attacks.model_poisoning import GaussianNoise, Scaling, SignFlip
from fedsim.attacks.omniscient import ALittleIsEnough, InnerProductManipulation, alie_z

__all__ = [
    "ALittleIsEnough",
    "Attack",
    "Backdoor",
    "DataAttack",
    "GaussianNoise",
    "InnerProductManipulation",
    "LabelFlip",
    "Scaling",
    "SignFlip",
    "alie_z",
]
