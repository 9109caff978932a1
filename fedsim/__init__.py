"""fedsim: federated-learning simulation in PyTorch. Public API re-exports only."""

from fedsim.client import Client
from fedsim.data.federated import FederatedData, federate, make_clients
from fedsim.data.tensor_data import DataSplit, TensorData
from fedsim.executor import Executor, SerialExecutor, Workload
from fedsim.logging import RunLogger
from fedsim.server import RoundFailedError, RunResult, Server
from fedsim.strategy import FedAvg, Strategy
from fedsim.types import ClientFailure, ClientUpdate, FitTask

__all__ = [
    "Client", "ClientFailure", "ClientUpdate", "DataSplit", "Executor", "FedAvg", "FederatedData", "FitTask",
    "RoundFailedError", "RunLogger", "RunResult", "SerialExecutor", "Server", "Strategy", "TensorData",
    "Workload", "federate", "make_clients",
]
