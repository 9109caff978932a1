"""Adversarial clients for evaluating robust aggregation (docs/attacks.md).

Configured by ``attack=<option>`` (``conf/attack/``); your own attack: subclass :class:`Attack`.
"""

from fedsim.attacks.base import Attack
from fedsim.attacks.model_poisoning import GaussianNoise, Scaling, SignFlip
from fedsim.attacks.omniscient import ALittleIsEnough, InnerProductManipulation, alie_z

__all__ = ["ALittleIsEnough", "Attack", "GaussianNoise", "InnerProductManipulation", "Scaling", "SignFlip", "alie_z"]
