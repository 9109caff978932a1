"""Executors run client tasks: serial (the reference) and persistent worker processes."""

from fedsim.executor.base import Executor, Workload
from fedsim.executor.process import ProcessExecutor
from fedsim.executor.serial import SerialExecutor

__all__ = ["Executor", "ProcessExecutor", "SerialExecutor", "Workload"]
