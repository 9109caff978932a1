"""Differential privacy: DP-FedAvg with fixed or adaptive clipping and its accountant (docs/communication.md).

Configured by ``dp=<option>`` (``conf/dp/``); :class:`CentralDP` from Python.
"""

from fedsim.privacy.accountant import PrivacyLedger
from fedsim.privacy.central import CentralDP

__all__ = ["CentralDP", "PrivacyLedger"]
