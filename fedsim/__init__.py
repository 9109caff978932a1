"""fedsim: federated-learning simulation in PyTorch. Public API re-exports only.

Names are imported on first use, so light tools (``python -m fedsim.report``) do not pay for torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Client": "fedsim.client",
    "ClientFailure": "fedsim.types",
    "ClientMisuseError": "fedsim.errors",
    "ClientUpdate": "fedsim.types",
    "DataSplit": "fedsim.data.tensor_data",
    "Executor": "fedsim.executor",
    "FedAvg": "fedsim.strategy",
    "FederatedData": "fedsim.data.federated",
    "FitTask": "fedsim.types",
    "ProcessExecutor": "fedsim.executor",
    "RoundFailedError": "fedsim.errors",
    "RunContext": "fedsim.context",
    "RunLogger": "fedsim.logging",
    "RunResult": "fedsim.server",
    "SerialExecutor": "fedsim.executor",
    "VmapExecutor": "fedsim.executor",
    "Server": "fedsim.server",
    "StateDictClient": "fedsim.adapters",
    "Strategy": "fedsim.strategy",
    "StrategyError": "fedsim.errors",
    "TensorData": "fedsim.data.tensor_data",
    "Workload": "fedsim.executor",
    "federate": "fedsim.data.federated",
    "make_clients": "fedsim.data.federated",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fedsim' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return __all__
