"""Executors run client tasks: serial (the reference) and, later, process, Ray and vmap."""

from fedsim.executor.base import Executor, Workload
from fedsim.executor.serial import SerialExecutor

__all__ = ["Executor", "SerialExecutor", "Workload"]
