"""RayExecutor: persistent Ray actors, one per worker slot, on one machine or a Ray cluster.

The workload (model factory, clients, training data) goes into Ray's object store once per run and
every actor builds its model from it once. The global weights go into the object store once per
round; every task of the round gets the same reference and each actor fetches it once per round.
Tasks are handed out dynamically (an idle actor gets the next client; while enough remain, each
actor also has its next client queued, so it never waits for the driver between two clients) and
results are returned sorted by client id, so answers equal the serial executor's with the same
``threads``. Weights cross the object store as NumPy arrays (see ``ray_actor.py``).
An actor that dies (crash, OOM kill) or exceeds ``client_timeout_s`` is replaced and its client
retried with the same seed, at most ``max_retries`` times; a kill by Ray's memory monitor is reported
as out of memory. Every actor logs to its own file in the run directory, tagged with round and client.

Ray is optional: this module imports it only when a :class:`RayExecutor` is created.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from fedsim.executor.base import Executor, Workload, retry_or_fail
from fedsim.executor.placement import physical_cores
from fedsim.executor.pool import POSSIBLY_OOM
from fedsim.executor.ray_actor import RayWorker, to_array, to_tensor
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


@dataclass
class _Slot:
    """One actor and the tasks submitted to it, oldest (running) first."""

    index: int
    actor: Any
    name: str
    queue: deque[tuple[FitTask, Any]] = field(default_factory=deque)  # (task, ObjectRef)
    started_at: float = 0.0  # when the oldest task in the queue started (about)


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
            self._actor_cls = ray.remote(RayWorker).options(
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
        ray = self._ray
        try:
            info = ray.get([s.actor.ready.remote() for s in slots], timeout=self.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"Ray actors were not ready after {self.start_timeout_s:g} s; does the cluster have "
                f"{self.threads} CPU(s) and {self.num_gpus_per_worker:g} GPU(s) per worker free?"
            ) from None
        except ray.exceptions.RayError as error:  # the actor's constructor failed (e.g. a module it needs is missing)
            raise RuntimeError(f"a Ray worker could not start: {type(error).__name__}: {error}") from None
        for slot, details in zip(slots, info):
            log.debug("ray worker %s ready: %s", slot.name, details)

    def fit(self, global_params: torch.Tensor, tasks: Sequence[FitTask]) -> list[TaskResult]:
        if not self._slots:
            raise RuntimeError("RayExecutor.fit called before start()")
        global_ref = [self._ray.put(to_array(global_params))]  # once per round, shared by every task
        pending = deque(sorted(tasks, key=lambda t: t.client_id))
        attempts: dict[int, int] = {}
        results: dict[int, TaskResult] = {}
        previous = torch.get_num_threads()
        torch.set_num_threads(1)  # as in the process executor: the actors own the cores while they train
        try:
            while pending or any(s.queue for s in self._slots):
                self._submit(global_ref, pending)
                self._collect(results, pending, attempts)
        finally:
            torch.set_num_threads(previous)
        return [results[cid] for cid in sorted(results)]

    def _submit(self, global_ref: list[Any], pending: deque[FitTask]) -> None:
        """Give every idle actor a task; while at least one task per actor remains, queue a second one
        behind each running task, so that an actor starts its next client without waiting for the
        driver to see the previous result. The last tasks go only to idle actors (dynamic balancing)."""
        for depth in (1, 2):
            for slot in self._slots:
                if len(slot.queue) < depth and pending and (depth == 1 or len(pending) >= len(self._slots)):
                    task = pending.popleft()
                    if not slot.queue:
                        slot.started_at = time.monotonic()
                    slot.queue.append((task, slot.actor.fit.remote(global_ref, task)))

    def _collect(self, results: dict[int, TaskResult], pending: deque[FitTask], attempts: dict[int, int]) -> None:
        """Wait briefly for finished tasks; handle results, dead actors and timeouts."""
        ray = self._ray
        running = {s.queue[0][1]: s for s in self._slots if s.queue}  # an actor runs its tasks in order
        ready, _ = ray.wait(list(running), num_returns=1, timeout=0.2)
        for ref in ready:
            slot = running[ref]
            try:
                result, params = ray.get(ref)
            except ray.exceptions.RayError as error:  # the actor died: crash, kill, OOM
                self._replace(slot, results, pending, attempts, _death_reason(ray, slot, error))
                continue
            results[result.client_id] = result if params is None else replace(result, params=to_tensor(params))
            slot.queue.popleft()
            slot.started_at = time.monotonic()
        now = time.monotonic()
        for slot in self._slots:
            if slot.queue and self.client_timeout_s is not None and now - slot.started_at > self.client_timeout_s:
                self._replace(slot, results, pending, attempts, f"client timed out after {self.client_timeout_s:g} s")

    def _replace(self, slot: _Slot, results: dict[int, TaskResult], pending: deque[FitTask], attempts: dict[int, int], reason: str) -> None:
        """Kill the slot's actor, start a fresh one in its place, retry or fail its running task and
        put the tasks queued behind it (which never started) back in line."""
        task = slot.queue.popleft()[0]
        log.warning("round %d client %d: %s; replacing Ray worker %s", task.round_num, task.client_id, reason, slot.name)
        self._ray.kill(slot.actor, no_restart=True)
        pending.extendleft(reversed([queued for queued, _ in slot.queue]))
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
