"""Aggregation strategies: the base class, pure aggregation math, and one file per algorithm."""

from fedsim.strategy.base import Strategy
from fedsim.strategy.fedavg import FedAvg

__all__ = ["FedAvg", "Strategy"]
