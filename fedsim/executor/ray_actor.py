"""The body of one Ray actor of :class:`~fedsim.executor.ray_executor.RayExecutor`.

An actor pins its thread budget, routes its output into its own log file, builds its model once,
then trains one task per call. Flat weights cross the object store as NumPy arrays, not tensors:
Ray stores and reads those without copying them through pickle (a 1.7 M-parameter update comes back
in ~5 ms instead of ~19 ms on the benchmark machine, see docs/performance.md).
"""

from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsim.core.params import fixed_state
from fedsim.core.types import ClientUpdate, EvalResult, EvalTask, FitTask, TaskResult
from fedsim.executor.base import Workload, run_task
from fedsim.executor.eval_task import run_eval_task
from fedsim.executor.worker_log import log_result, redirect_output, tagged


def to_array(flat: torch.Tensor) -> np.ndarray:
    """A flat CPU tensor as the NumPy array that crosses the object store (shares its memory)."""
    return flat.detach().cpu().numpy()


def to_tensor(array: np.ndarray) -> torch.Tensor:
    """A private, writable tensor copy of an array read from the object store (those are read-only)."""
    return torch.from_numpy(np.array(array, copy=True))


class RayWorker:
    """Builds its model once, then trains one task per call."""

    def __init__(self, name: str, workload: Workload, threads: int, use_gpu: bool, log_path: Path | None) -> None:
        self.log = redirect_output(name, log_path)  # before anything prints: the actor's own file, tagged
        torch.set_num_threads(threads)
        with contextlib.suppress(RuntimeError):  # already set in this process
            torch.set_num_interop_threads(1)
        self.name, self.workload = name, workload
        # Arrays inside the workload arrive read-only (zero-copy from the object store); clients are
        # small, so each actor gets its own writable copy of them. Training data stays shared.
        self.clients = copy.deepcopy(list(workload.clients))
        self.device = torch.device("cuda", 0) if use_gpu else torch.device("cpu")  # Ray sets CUDA_VISIBLE_DEVICES
        with torch.random.fork_rng(devices=[]):
            self.model = workload.model_factory().to(self.device)
        self.fixed = fixed_state(self.model)  # before the warm-up step (see fedsim.core.params)
        data = workload.train_data
        self.data = (
            data if self.device.type == "cpu" else replace(data, x=data.x.to(self.device), y=data.y.to(self.device))
        )
        self._round_ref: Any = None
        self._global: torch.Tensor | None = None
        self._warm_up()
        self.log.info(
            "worker %s ready on %s (pid %d, %d threads)", name, self.device, os.getpid(), torch.get_num_threads()
        )

    def _warm_up(self) -> None:
        """Pay one-time costs (lazy imports behind the first optimizer step, first backward) now, so that
        they count neither in the first round nor against ``client_timeout_s``. Every task overwrites the weights."""
        x, y = self.data.x[:2], self.data.y[:2]
        with torch.random.fork_rng(devices=[]):
            optimizer = torch.optim.SGD(self.model.parameters(), lr=0.0)
            torch.nn.functional.cross_entropy(self.model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    def ready(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "device": str(self.device), "threads": torch.get_num_threads()}

    def fit(self, global_ref: list[Any], task: FitTask | EvalTask) -> tuple[TaskResult | EvalResult, np.ndarray | None]:
        """Train ``task``; returns the result without its weights, and the weights as an array. An
        :class:`~fedsim.core.types.EvalTask` is scored instead (its result carries no weights).

        ``global_ref`` is ``[ObjectRef]`` (wrapped so that Ray does not resolve it per call): the
        actor fetches the round's global weights once, on its first task of the round."""
        import ray

        if global_ref[0] != self._round_ref:
            self._round_ref, self._global = global_ref[0], to_tensor(ray.get(global_ref[0]))
        assert self._global is not None
        if isinstance(task, EvalTask):
            with tagged(task):
                scored = run_eval_task(
                    self.model, self.clients, self.data, self._global, task, self.name, self.workload.local, self.fixed
                )
                log_result(self.log, scored)
            return scored, None
        with tagged(task):
            result = run_task(
                self.model,
                self.clients[task.client_id],
                self.data,
                self._global,
                task,
                self.name,
                self.workload.local,
                self.fixed,
            )
            log_result(self.log, result)
        if (
            isinstance(result, ClientUpdate)
            and isinstance(result.params, torch.Tensor)
            and result.params.dtype == self._global.dtype
        ):
            return replace(result, params=torch.empty(0)), to_array(result.params)
        # anything else (not a tensor, another dtype) travels as it is; the server rejects it with its reason
        return result, None
