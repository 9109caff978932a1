"""RayExecutor: persistent Ray actors, one per worker slot, on one machine or a Ray cluster.

The workload (model factory, clients, training data) goes into Ray's object store once per run and
every actor builds its model from it once. The global weights go into the object store once per
round; every task of the round gets the same reference and each actor fetches it once per round.
Tasks are handed out dynamically (an idle actor gets the next client) and results are returned
sorted by client id, so answers equal the serial executor's with the same ``threads``.
An actor that dies (crash, OOM kill) or exceeds ``client_timeout_s`` is replaced and its client
retried with the same seed, at most ``max_retries`` times; a kill by Ray's memory monitor is reported
as out of memory. Every actor logs to its own file in the run directory, tagged with round and client.

Ray is optional: this module imports it only when a :class:`RayExecutor` is created.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from fedsim.executor.base import Executor, Workload, retry_or_fail, run_task
from fedsim.executor.placement import physical_cores
from fedsim.executor.pool import POSSIBLY_OOM
from fedsim.executor.worker_log import log_result, redirect_output, tagged
from fedsim.types import FitTask, TaskResult

log = logging.getLogger("fedsim")

_RAY_OOM = re.compile(r"running low on memory|OOM kill reason|NODE_OUT_OF_MEMORY", re.IGNORECASE)
MISSING_RAY = "executor=ray needs Ray: pip install 'fedsim[ray]'"


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError(MISSING_RAY) from None
    return ray


class _RayWorker:
    """The body of one actor: builds its model once, then trains one task per call."""

    def __init__(self, name: str, workload: Workload, threads: int, use_gpu: bool, log_path: Path | None) -> None:
        self.log = redirect_output(name, log_path)  # before anything prints: the actor's own file, tagged
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set in this process
            pass
        self.name, self.workload = name, workload
        # Arrays inside the workload arrive read-only (zero-copy from the object store); clients are
        # small, so each actor gets its own writable copy of them. Training data stays shared.
        self.clients = copy.deepcopy(list(workload.clients))
        self.device = torch.device("cuda", 0) if use_gpu else torch.device("cpu")  # Ray sets CUDA_VISIBLE_DEVICES
        with torch.random.fork_rng(devices=[]):
            self.model = workload.model_factory().to(self.device)
        data = workload.train_data
        self.data = data if self.device.type == "cpu" else replace(data, x=data.x.to(self.device), y=data.y.to(self.device))
        self._round_ref: Any = None
        self._global: torch.Tensor | None = None
        self._warm_up()
        self.log.info("worker %s ready on %s (pid %d, %d threads)", name, self.device, os.getpid(), torch.get_num_threads())

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

    def fit(self, global_ref: list[Any], task: FitTask) -> TaskResult:
        """``global_ref`` is ``[ObjectRef]`` (wrapped so that Ray does not resolve it per call)."""
        import ray

        if global_ref[0] != self._round_ref:  # first task of this round on this actor
            self._round_ref, self._global = global_ref[0], ray.get(global_ref[0])
        assert self._global is not None
        with tagged(task):
            result = run_task(self.model, self.clients[task.client_id], self.data, self._global, task, self.name, self.workload.local)
            log_result(self.log, result)
        return result


@dataclass
class _Slot:
    index: int
    actor: Any
    name: str
    task: FitTask | None = None
    ref: Any = None
    started_at: float = 0.0


class RayExecutor(Executor):
    """Runs client tasks in ``workers`` Ray actors.

    ``address``: ``None`` starts a local Ray instance (or reuses the one this process already
    started); ``"auto"`` or ``"ray://host:port"`` joins a running cluster. ``workers`` defaults to
    ``cores // threads`` on CPU or ``GPUs / num_gpus_per_worker``. Every actor asks Ray for ``threads``
    CPUs and ``num_gpus_per_worker`` GPUs (e.g. 0.5: two actors share a GPU). ``runtime_env`` is passed
    to ``ray.init`` (e.g. ``{"working_dir": "."}`` to ship your client classes to a cluster).
    """

    def __init__(
        self,
        *,
        address: str | None = None,
        workers: int | None = None,
        threads: int = 1,
        num_gpus_per_worker: float = 0.0,
        client_timeout_s: float | None = None,
        max_retries: int = 2,
        start_timeout_s: float = 300.0,
        runtime_env: dict[str, Any] | None = None,
    ) -> None:
        self._ray = _import_ray()
        for name, value in (("workers", workers), ("threads", threads)):
            if value is not None and value < 1:
                raise ValueError(f"executor.{name} must be >= 1 (got {value})")
        if num_gpus_per_worker < 0:
            raise ValueError(f"executor.num_gpus_per_worker must be >= 0 (got {num_gpus_per_worker})")
        if client_timeout_s is not None and client_timeout_s <= 0:
            raise ValueError(f"executor.client_timeout_s must be > 0 or null (got {client_timeout_s})")
        if max_retries < 0:
            raise ValueError(f"executor.max_retries must be >= 0 (got {max_retries})")
        self.address, self.workers, self.threads = address, workers, threads
        self.num_gpus_per_worker, self.runtime_env = num_gpus_per_worker, runtime_env
        self.client_timeout_s, self.max_retries, self.start_timeout_s = client_timeout_s, max_retries, start_timeout_s
        self._owns_ray = False
        self._slots: list[_Slot] = []
        self._workload_ref: Any = None
        self._log_dir: Path | None = None
        self._actor_cls: Any = None

    def start(self, workload: Workload) -> None:
        ray = self._ray
        self._connect()
        try:
            self.workers = self.workers or self._default_workers()
            self._actor_cls = ray.remote(_RayWorker).options(
                num_cpus=self.threads, num_gpus=self.num_gpus_per_worker, max_restarts=0, max_task_retries=0
            )
            self._workload_ref, self._log_dir = ray.put(workload), workload.log_dir
            self._slots = [self._launch(index) for index in range(self.workers)]
            self._await_ready(self._slots)
        except BaseException:
            self.close()
            raise

    def _connect(self) -> None:
        ray = self._ray
        if ray.is_initialized():
            return
        if self.address is None:
            cpus = self.workers * self.threads if self.workers else physical_cores()
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(num_cpus=cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                     runtime_env=self.runtime_env, log_to_driver=True)
        else:
            ray.init(address=self.address, runtime_env=self.runtime_env)
        self._owns_ray = True

    def _default_workers(self) -> int:
        resources = self._ray.cluster_resources()
        if self.num_gpus_per_worker > 0:
            return max(1, int(resources.get("GPU", 0) / self.num_gpus_per_worker))
        return max(1, int(resources.get("CPU", 1)) // self.threads)

    def _launch(self, index: int) -> _Slot:
        """Start actor ``r<index>``; it logs to ``<run dir>/workers/ray-worker-<index>.log`` (on its own node)."""
        name = f"r{index}"
        log_path = self._log_dir / "workers" / f"ray-worker-{index}.log" if self._log_dir is not None else None
        actor = self._actor_cls.remote(name, self._workload_ref, self.threads, self.num_gpus_per_worker > 0, log_path)
        return _Slot(index, actor, name)

    def _await_ready(self, slots: list[_Slot]) -> None:
        try:
            info = self._ray.get([s.actor.ready.remote() for s in slots], timeout=self.start_timeout_s)
        except Exception as error:  # noqa: BLE001 - GetTimeoutError, actor construction failure
            raise RuntimeError(
                f"Ray actors were not ready after {self.start_timeout_s:g} s ({type(error).__name__}: {error}); "
                f"does the cluster have {self.threads} CPU(s) and {self.num_gpus_per_worker:g} GPU(s) per worker free?"
            ) from None
        for slot, details in zip(slots, info):
            log.debug("ray worker %s ready: %s", slot.name, details)

    def fit(self, global_params: torch.Tensor, tasks: Sequence[FitTask]) -> list[TaskResult]:
        if not self._slots:
            raise RuntimeError("RayExecutor.fit called before start()")
        global_ref = [self._ray.put(global_params)]  # once per round, shared by every task
        pending = deque(sorted(tasks, key=lambda t: t.client_id))
        attempts: dict[int, int] = {}
        results: dict[int, TaskResult] = {}
        while pending or any(s.task is not None for s in self._slots):
            for slot in self._slots:
                if slot.task is None and pending:
                    slot.task, slot.started_at = pending.popleft(), time.monotonic()
                    slot.ref = slot.actor.fit.remote(global_ref, slot.task)
            self._collect(results, pending, attempts)
        return [results[cid] for cid in sorted(results)]

    def _collect(self, results: dict[int, TaskResult], pending: deque[FitTask], attempts: dict[int, int]) -> None:
        """Wait briefly for finished tasks; handle results, dead actors and timeouts."""
        ray = self._ray
        busy = {s.ref: s for s in self._slots if s.task is not None}
        ready, _ = ray.wait(list(busy), num_returns=1, timeout=0.2)
        for ref in ready:
            slot = busy[ref]
            try:
                result = ray.get(ref)
            except ray.exceptions.RayError as error:  # the actor died: crash, kill, OOM
                self._replace(slot, results, pending, attempts, _death_reason(ray, slot, error))
                continue
            results[result.client_id] = result
            slot.task, slot.ref = None, None
        now = time.monotonic()
        for slot in self._slots:
            if slot.task is not None and self.client_timeout_s is not None and now - slot.started_at > self.client_timeout_s:
                self._replace(slot, results, pending, attempts, f"client timed out after {self.client_timeout_s:g} s")

    def _replace(self, slot: _Slot, results: dict[int, TaskResult], pending: deque[FitTask], attempts: dict[int, int], reason: str) -> None:
        """Kill the slot's actor, start a fresh one in its place, and retry or fail its task."""
        task = slot.task
        assert task is not None
        log.warning("round %d client %d: %s; replacing Ray worker %s", task.round_num, task.client_id, reason, slot.name)
        self._ray.kill(slot.actor, no_restart=True)
        fresh = self._launch(slot.index)
        self._slots[self._slots.index(slot)] = fresh
        self._await_ready([fresh])
        retry_or_fail(task, reason, slot.name, self.max_retries, attempts, pending, results)

    def close(self) -> None:
        """Kill every actor; shut Ray down only if this executor started it. Safe to call twice."""
        ray = self._ray
        for slot in self._slots:
            try:
                ray.kill(slot.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead or Ray already down
                pass
        self._slots, self._workload_ref, self._actor_cls = [], None, None
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        self._owns_ray = False


def _death_reason(ray: Any, slot: _Slot, error: Exception) -> str:
    """One line saying why an actor's task did not come back, worded like the process executor's."""
    # Ray's memory monitor makes the task raise OutOfMemoryError (checked with a real kill, Ray 2.60).
    # Ray's generic death message lists "the OOM killer" only as a *possible* cause: a SIGKILL from the
    # OS OOM killer, any other SIGKILL and a segfault all read the same (exit type SYSTEM_ERROR).
    text = str(error)
    if isinstance(error, getattr(ray.exceptions, "OutOfMemoryError", ())) or _RAY_OOM.search(text):
        return f"Ray worker {slot.name} was killed by Ray's memory monitor: out of memory"
    if "SYSTEM_ERROR" in text:
        return f"Ray worker {slot.name} was killed or crashed ({POSSIBLY_OOM}; Ray does not say which signal)"
    return f"Ray worker {slot.name} died ({type(error).__name__})"
