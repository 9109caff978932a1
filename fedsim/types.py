"""The records a strategy and an executor exchange, kept at this path for researchers' code
(docs/writing-a-strategy.md): defined in :mod:`fedsim.core.types`."""

from fedsim.core.types import ClientFailure, ClientScore, ClientUpdate, EvalResult, EvalTask, FitTask, TaskResult

__all__ = ["ClientFailure", "ClientScore", "ClientUpdate", "EvalResult", "EvalTask", "FitTask", "TaskResult"]
