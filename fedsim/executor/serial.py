"""SerialExecutor: runs tasks one after another in this process. The reference implementation."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedsim.core.checks import integer
from fedsim.core.params import fixed_state
from fedsim.core.progress import progress
from fedsim.core.threads import torch_threads
from fedsim.core.types import ClientFailure, EvalResult, EvalTask, FitTask, TaskResult
from fedsim.executor.base import Executor, Workload, run_task
from fedsim.executor.eval_task import run_eval_task


class SerialExecutor(Executor):
    """Trains each task in the calling process on ``device``, reusing one model instance for the run.

    Training runs with ``threads`` intra-op threads (restored afterwards). CPU kernels round
    differently with different thread counts, so executors agree bitwise when their ``threads`` agree.
    """

    def __init__(self, device: str = "cpu", threads: int = 1) -> None:
        integer("executor.threads", threads, 1)
        self.device = torch.device(device)
        self.threads = threads
        self._workload: Workload | None = None
        self._model: torch.nn.Module | None = None
        self._fixed: dict[str, torch.Tensor] = {}

    def start(self, workload: Workload) -> None:
        self._workload = workload
        with torch.random.fork_rng(devices=[]), progress("building the model", None, "step"):  # the caller's RNG stays
            self._model = workload.model_factory().to(self.device)
        self._fixed = fixed_state(self._model)

    def fit(self, global_params: torch.Tensor, tasks: Sequence[FitTask]) -> list[TaskResult]:
        if self._workload is None or self._model is None:
            raise RuntimeError("SerialExecutor.fit called before start()")
        clients, data = self._workload.clients, self._workload.train_data
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            return [
                run_task(
                    self._model,
                    clients[task.client_id],
                    data,
                    global_params,
                    task,
                    "serial",
                    self._workload.local,
                    self._fixed,
                )
                for task in sorted(tasks, key=lambda t: t.client_id)
            ]
        finally:
            torch.set_num_threads(previous)

    def evaluate(self, global_params: torch.Tensor, tasks: Sequence[EvalTask]) -> list[EvalResult | ClientFailure]:
        if self._workload is None or self._model is None:
            raise RuntimeError("SerialExecutor.evaluate called before start()")
        clients, data = self._workload.clients, self._workload.train_data
        with torch_threads(self.threads):
            return [
                run_eval_task(
                    self._model, clients, data, global_params, task, "serial", self._workload.local, self._fixed
                )
                for task in sorted(tasks, key=lambda t: t.client_id)
            ]

    def close(self) -> None:
        self._model = None
        self._workload = None
