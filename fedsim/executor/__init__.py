"""Executors run client tasks: serial (the reference), persistent worker processes, Ray actors, vmap."""

from fedsim.executor.base import Executor, Workload
from fedsim.executor.process import ProcessExecutor
from fedsim.executor.ray import RayExecutor  # imports the ray library only when instantiated
from fedsim.executor.serial import SerialExecutor
from fedsim.executor.vmap import VmapExecutor, VmapUnsupportedError

__all__ = [
    "Executor",
    "ProcessExecutor",
    "RayExecutor",
    "SerialExecutor",
    "VmapExecutor",
    "VmapUnsupportedError",
    "Workload",
]
