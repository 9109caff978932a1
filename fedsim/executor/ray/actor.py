"""The body of one Ray actor of :class:`~fedsim.executor.ray.RayExecutor`.

An actor pins its thread budget, routes its output into its own log file, builds its model once per
run, then trains one task per call; with ``reuse_actors`` a later run in the same driver loads its own
workload into the same actor instead of starting a new one. Flat weights cross the object store as
NumPy arrays, not tensors: Ray stores and reads those without copying them through pickle (a 1.7
M-parameter update comes back in ~5 ms instead of ~19 ms on the benchmark machine, see
docs/performance.md).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsim.client.base import Client
from fedsim.client.federation import Population
from fedsim.core.params import fixed_state, frozen_hash
from fedsim.core.types import ClientUpdate, EvalResult, EvalTask, FitTask, TaskResult
from fedsim.data.tensor_data import TensorData
from fedsim.executor.base import Workload, run_task
from fedsim.executor.eval_task import run_eval_task
from fedsim.executor.worker_log import log_result, redirect_output, tagged


def to_array(flat: torch.Tensor) -> np.ndarray:
    """A flat CPU tensor as the NumPy array that crosses the object store (shares its memory)."""
    return flat.detach().cpu().numpy()


def to_tensor(array: np.ndarray) -> torch.Tensor:
    """A private, writable tensor copy of an array read from the object store (those are read-only)."""
    return torch.from_numpy(np.array(array, copy=True))


@dataclass
class _Run:
    """What an actor holds for one run: built by :meth:`RayWorker.load`, dropped by :meth:`RayWorker.release`."""

    name: str
    workload: Workload
    clients: Sequence[Client]
    model: torch.nn.Module
    fixed: dict[str, torch.Tensor]
    data: TensorData
    log: logging.Logger
    round_ref: Any = None  # the ObjectRef of the round whose global weights are in ``global_params``
    global_params: torch.Tensor | None = None


class RayWorker:
    """Builds its model once per run, then trains one task per call. A later run that reuses the actor
    (``RayExecutor(reuse_actors=True)``) calls :meth:`load` with its own workload instead of starting another."""

    def __init__(self, name: str, workload: Workload, threads: int, use_gpu: bool, log_path: Path | None) -> None:
        torch.set_num_threads(threads)
        with contextlib.suppress(RuntimeError):  # already set in this process
            torch.set_num_interop_threads(1)
        self.device = torch.device("cuda", 0) if use_gpu else torch.device("cpu")  # Ray sets CUDA_VISIBLE_DEVICES
        self.run: _Run | None = None
        self.load(name, workload, log_path)

    def load(self, name: str, workload: Workload, log_path: Path | None) -> dict[str, Any]:
        """Get ready for a run: its log file, a private copy of its clients, its model (built under a forked RNG, as in
        a new actor) and its training data on this actor's device; whatever an earlier run left is replaced.
        Returns :meth:`ready`'s answer."""
        self.run = None
        log = redirect_output(name, log_path)  # before anything prints: the actor's own file, tagged
        # Arrays inside the workload arrive read-only (zero-copy from the object store); clients are
        # small, so each actor gets its own writable copy of them. Training data stays shared.
        clients = copy.deepcopy(
            workload.clients if isinstance(workload.clients, Population) else list(workload.clients)
        )
        with torch.random.fork_rng(devices=[]):
            model = workload.model_factory().to(self.device)
        fixed = fixed_state(model)  # before the warm-up step (see fedsim.core.params)
        data = workload.train_data
        if self.device.type != "cpu":
            data = replace(data, x=data.x.to(self.device), y=data.y.to(self.device))
        _warm_up(model, data)
        self.run = _Run(name, workload, clients, model, fixed, data, log)
        log.info("worker %s ready on %s (pid %d, %d threads)", name, self.device, os.getpid(), torch.get_num_threads())
        return self.ready()

    def release(self) -> None:
        """Drop the run (workload, clients, model, data: the object store frees what only this actor held) and close
        its log file; the actor waits, warm, for the next :meth:`load`."""
        self.run = None
        redirect_output("idle", None)
        gc.collect()

    def ready(self) -> dict[str, Any]:
        """Who this actor is, and ``frozen_hash``: the hash of its model's frozen weights (a LoRA model's base, which
        never travels), which the executor compares with the driver's."""
        frozen = frozen_hash(self.run.model) if self.run is not None else ""
        threads = torch.get_num_threads()
        return {"pid": os.getpid(), "device": str(self.device), "threads": threads, "frozen_hash": frozen}

    def fit(self, global_ref: list[Any], task: FitTask | EvalTask) -> tuple[TaskResult | EvalResult, np.ndarray | None]:
        """Train ``task``; returns the result without its weights, and the weights as an array. An
        :class:`~fedsim.core.types.EvalTask` is scored instead (its result carries no weights).

        ``global_ref`` is ``[ObjectRef]`` (wrapped so that Ray does not resolve it per call): the
        actor fetches the round's global weights once, on its first task of the round."""
        import ray

        run = self.run
        if run is None:
            raise RuntimeError("RayWorker.fit called after release() and before load()")
        if global_ref[0] != run.round_ref:
            run.round_ref, run.global_params = global_ref[0], to_tensor(ray.get(global_ref[0]))
        assert run.global_params is not None
        local = run.workload.local
        if isinstance(task, EvalTask):
            with tagged(task):
                scored = run_eval_task(
                    run.model, run.clients, run.data, run.global_params, task, run.name, local, run.fixed
                )
                log_result(run.log, scored)
            return scored, None
        with tagged(task):
            result = run_task(
                run.model, run.clients[task.client_id], run.data, run.global_params, task, run.name, local, run.fixed
            )
            log_result(run.log, result)
        if (
            isinstance(result, ClientUpdate)
            and isinstance(result.params, torch.Tensor)
            and result.params.dtype == run.global_params.dtype
        ):
            return replace(result, params=torch.empty(0)), to_array(result.params)
        # anything else (not a tensor, another dtype) travels as it is; the server rejects it with its reason
        return result, None


def _warm_up(model: torch.nn.Module, data: TensorData) -> None:
    """Pay one-time costs (lazy imports behind the first optimizer step, first backward) now, so that they count
    neither in the first round nor against ``client_timeout_s``. Every task overwrites the weights."""
    x, y = data.x[:2], data.y[:2]
    with torch.random.fork_rng(devices=[]):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        logits = model(x)  # [2, classes], or [2, T, vocab] with token labels [2, T]: one row per label
        torch.nn.functional.cross_entropy(logits.flatten(0, -2), y.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
