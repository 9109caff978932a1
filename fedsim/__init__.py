"""fedsim: federated-learning simulation in PyTorch. Public API re-exports only.

Names are imported on first use, so light tools (``python -m fedsim.report``) do not pay for torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Checkpoints": "fedsim.server.settings",
    "Client": "fedsim.client.base",
    "ClientFailure": "fedsim.core.types",
    "ClientMisuseError": "fedsim.core.errors",
    "ClientUpdate": "fedsim.core.types",
    "DataSplit": "fedsim.data.tensor_data",
    "Evaluation": "fedsim.server.settings",
    "Executor": "fedsim.executor",
    "Federation": "fedsim.server.settings",
    "FedAvg": "fedsim.strategy",
    "FederatedData": "fedsim.client.federation",
    "FitTask": "fedsim.core.types",
    "ProcessExecutor": "fedsim.executor",
    "RoundFailedError": "fedsim.core.errors",
    "RoundRecord": "fedsim.server.record",
    "RoundStage": "fedsim.server.stage",
    "RunContext": "fedsim.strategy.context",
    "RunLogger": "fedsim.observe.run_logger",
    "RunResult": "fedsim.server.server",
    "Schedule": "fedsim.server.settings",
    "SerialExecutor": "fedsim.executor",
    "VmapExecutor": "fedsim.executor",
    "Server": "fedsim.server.server",
    "Stages": "fedsim.server.settings",
    "StateDictClient": "fedsim.client.adapters",
    "Strategy": "fedsim.strategy",
    "StrategyError": "fedsim.core.errors",
    "TensorData": "fedsim.data.tensor_data",
    "Workload": "fedsim.executor",
    "federate": "fedsim.client.federation",
    "make_clients": "fedsim.client.federation",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fedsim' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return __all__
