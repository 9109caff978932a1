"""Executors run client tasks: serial (the reference), persistent worker processes, Ray actors."""

from fedsim.executor.base import Executor, Workload
from fedsim.executor.process import ProcessExecutor
from fedsim.executor.ray_executor import RayExecutor  # imports ray only when instantiated
from fedsim.executor.serial import SerialExecutor

__all__ = ["Executor", "ProcessExecutor", "RayExecutor", "SerialExecutor", "Workload"]
