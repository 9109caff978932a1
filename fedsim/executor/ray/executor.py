"""RayExecutor: persistent Ray actors, one per worker slot, on one machine or a Ray cluster.

The workload (model factory, clients, training data) goes into Ray's object store once per run and
every actor builds its model from it once. The global weights go into the object store once per
round; every task of the round gets the same reference and each actor fetches it once per round.
Tasks are handed out dynamically (an idle actor gets the next client; while enough remain, each
actor also has its next client queued, so it never waits for the driver between two clients) and
results are returned sorted by client id, so answers equal the serial executor's with the same
``threads``. Weights cross the object store as NumPy arrays (see ``actor.py``).
An actor that dies (crash, OOM kill, its node lost) or exceeds ``client_timeout_s`` is replaced and its
client retried with the same seed, at most ``max_retries`` times; a kill by Ray's memory monitor is
reported as out of memory. A replacement starts in the background: the round goes on with the actors
that are ready, so a cluster that lost a node finishes the round on the survivors (the replacement
joins when the cluster has room for it). An actor killed while starting is started again, at most
``MAX_FAILED_STARTS`` times in a row; one whose constructor fails (it would again) stops the run at once.
Every actor logs to its own file in the run directory, tagged with round and client. With
``reuse_actors`` the actors that are idle and healthy at the end of a run stay up, empty, for the next run in
the same process (a sweep, a loop in a notebook), which loads its workload into them (``warm.py``).

Ray is optional: this module imports it only when a :class:`RayExecutor` is created.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from fedsim.core.checks import integer, number
from fedsim.core.errors import WorkerStartupError
from fedsim.core.extras import missing_text, require
from fedsim.core.params import NO_FROZEN_WEIGHTS, frozen_hash
from fedsim.core.progress import progress
from fedsim.core.types import ClientFailure, EvalResult, EvalTask, FitTask, TaskResult
from fedsim.executor.base import MAX_FAILED_STARTS, Executor, Workload, retry_or_fail
from fedsim.executor.placement import physical_cores
from fedsim.executor.ray import warm as ray_warm
from fedsim.executor.ray.actor import RayWorker, to_array, to_tensor
from fedsim.executor.ray.reasons import death_reason, kill_quietly, start_failure

log = logging.getLogger("fedsim")

MISSING_RAY = missing_text("executor=ray", "ray", "ray")


def _frozen_hash(workload: Workload) -> str:
    """The hash of the frozen weights of the model ``workload`` builds here, in the driver (a throwaway model, built
    under a forked RNG so that the caller's RNG does not advance)."""
    with torch.random.fork_rng(devices=[]):
        return frozen_hash(workload.model_factory())


def _check_frozen_base(name: str, details: dict[str, Any], workload: Workload, expected: list[str]) -> None:
    """Refuse, in one line, an actor whose model's frozen weights (a LoRA model's base, which never travels) differ
    from the driver's: its updates would be adapters of another model. The driver builds its own model for this only
    when an actor reports frozen weights (``expected`` caches its hash): a model without any, every classic one, is
    never built here (a model factory may do anything on the process that calls it, e.g. claim a GPU)."""
    got = str(details.get("frozen_hash", NO_FROZEN_WEIGHTS))
    if got == NO_FROZEN_WEIGHTS:
        return
    if not expected:
        expected.append(_frozen_hash(workload))
    if got != expected[0]:
        raise WorkerStartupError(
            f"model: Ray worker {name} (pid {details.get('pid')}) built a frozen base (hash {got[:12]}) different from "
            f"the driver's ({expected[0][:12]}); the model factory must build the same frozen weights everywhere (seed "
            "them from the run seed, load them from the same model.path on every node)"
        )


def _import_ray() -> Any:
    return require("ray", "executor=ray", "ray")


@dataclass
class _Slot:
    """One actor and the tasks submitted to it, oldest (running) first. ``starting`` is the reference of the
    actor's ``ready()`` call until it has answered; only a ready actor gets tasks."""

    index: int
    actor: Any
    name: str
    starting: Any = None
    launched_at: float = 0.0
    failed_starts: int = 0  # in a row, for this slot
    waiting_said: bool = False  # the "waits for room on the cluster" line was logged for this start
    queue: deque[tuple[FitTask | EvalTask, Any]] = field(default_factory=deque)  # (task, ObjectRef)
    reused: bool = False  # the actor is a warm one from an earlier run, loading this run's workload
    started_at: float = 0.0  # when the oldest task in the queue started (about)


class RayExecutor(Executor):
    """Runs client tasks in ``workers`` Ray actors.

    ``address``: ``None`` starts a local Ray instance (or reuses the one this process already
    started); ``"auto"`` or ``"ray://host:port"`` joins a running cluster. ``workers`` defaults to
    ``cores // threads`` on CPU or ``GPUs / num_gpus_per_worker``. Every actor asks Ray for ``threads``
    CPUs and ``num_gpus_per_worker`` GPUs (e.g. 0.5: two actors share a GPU). ``runtime_env`` is passed
    to ``ray.init`` (e.g. ``{"working_dir": "."}`` to ship your client classes to a cluster).

    ``reuse_actors``: at the end of the run keep the idle, healthy actors (and the Ray this executor started) for
    the next ``RayExecutor`` with the same ``threads`` and ``num_gpus_per_worker`` in this process, which loads its
    workload into them instead of starting new ones (seconds per actor). Kept actors hold their CPUs and GPUs until
    the next run takes or kills them, :func:`~fedsim.executor.ray.release_warm_actors`, ``ray.shutdown()`` or
    the end of the process; and a module they imported is not imported again, so restart the process after editing
    your client's module.
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
        reuse_actors: bool = False,
    ) -> None:
        self._ray = _import_ray()
        for name, value in (("workers", workers), ("threads", threads)):
            if value is not None:
                integer(f"executor.{name}", value, 1)
        number("executor.num_gpus_per_worker", num_gpus_per_worker, at_least=0)
        if client_timeout_s is not None and client_timeout_s <= 0:
            raise ValueError(f"executor.client_timeout_s must be > 0 or null (got {client_timeout_s})")
        integer("executor.max_retries", max_retries, 0)
        self.address, self.workers, self.threads = address, workers, threads
        self.num_gpus_per_worker, self.runtime_env = num_gpus_per_worker, runtime_env
        self.client_timeout_s, self.max_retries, self.start_timeout_s = client_timeout_s, max_retries, start_timeout_s
        self.reuse_actors = reuse_actors
        self._owns_ray = False
        self._slots: list[_Slot] = []
        self._workload_ref: Any = None
        self._log_dir: Path | None = None
        self._actor_cls: Any = None
        self._frozen_hash: list[str] = []  # of the driver's model's frozen weights (a LoRA base), once computed
        self._workload: Workload | None = None

    def start(self, workload: Workload) -> None:
        """Start every actor and wait until all are ready (an actor killed while starting is started again)."""
        ray = self._ray
        self._connect()
        try:
            self.workers = self.workers or self._default_workers()
            self._actor_cls = ray.remote(RayWorker).options(
                num_cpus=self.threads, num_gpus=self.num_gpus_per_worker, max_restarts=0, max_task_retries=0
            )
            self._frozen_hash, self._workload = [], workload
            self._workload_ref, self._log_dir = ray.put(workload), workload.log_dir
            warm = ray_warm.take(ray, self.threads, self.num_gpus_per_worker, self.workers if self.reuse_actors else 0)
            self._slots = [_Slot(index, None, f"r{index}") for index in range(self.workers)]
            for slot, actor in zip(self._slots, warm, strict=False):
                self._reload(slot, actor)
            for slot in self._slots[len(warm) :]:
                self._launch(slot)
            with progress("starting Ray workers (each builds the model)", len(self._slots), "worker") as ready:
                while any(slot.starting is not None for slot in self._slots):
                    before = sum(slot.starting is None for slot in self._slots)
                    self._wait({}, deque(), {}, all_needed=True)
                    ready(max(0, sum(slot.starting is None for slot in self._slots) - before))
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
            ray.init(
                num_cpus=cpus,
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                runtime_env=self.runtime_env,
                log_to_driver=True,
            )
        else:
            ray.init(address=self.address, runtime_env=self.runtime_env)
        self._owns_ray = True

    def _default_workers(self) -> int:
        resources = self._ray.cluster_resources()
        if self.num_gpus_per_worker > 0:
            return max(1, int(resources.get("GPU", 0) / self.num_gpus_per_worker))
        return max(1, int(resources.get("CPU", 1)) // self.threads)

    def _log_path(self, slot: _Slot) -> Path | None:
        """``<run dir>/workers/ray-worker-<index>.log`` (on the actor's own node)."""
        return self._log_dir / "workers" / f"ray-worker-{slot.index}.log" if self._log_dir is not None else None

    def _launch(self, slot: _Slot) -> None:
        """Start a fresh actor ``r<index>`` in ``slot`` without waiting for it."""
        slot.actor = self._actor_cls.remote(
            slot.name, self._workload_ref, self.threads, self.num_gpus_per_worker > 0, self._log_path(slot)
        )
        slot.starting, slot.launched_at, slot.waiting_said = slot.actor.ready.remote(), time.monotonic(), False
        slot.reused = False

    def _reload(self, slot: _Slot, actor: Any) -> None:
        """Give a warm actor of an earlier run this run's workload, without waiting for it."""
        slot.actor, slot.reused = actor, True
        slot.starting = actor.load.remote(slot.name, self._workload_ref, self._log_path(slot))
        slot.launched_at, slot.waiting_said = time.monotonic(), False

    def _started(self, slot: _Slot) -> None:
        """``slot``'s actor answered ``ready()``: it may train, or it failed to start. A start killed from outside
        (a signal, its node lost) is tried again, up to ``MAX_FAILED_STARTS`` in a row; a constructor that raised
        would raise again, so that ends the run at once (one line)."""
        ray = self._ray
        try:
            details = ray.get(slot.starting)
        except ray.exceptions.RayError as error:
            if slot.reused and isinstance(error, ray.exceptions.RayActorError):  # killed while it waited
                log.debug("warm Ray worker %s was gone; starting a new one", slot.name)
                self._launch(slot)
                return
            slot.failed_starts += 1
            reason, retryable = start_failure(ray, slot.name, error)
            if not retryable:
                raise WorkerStartupError(reason) from None
            if slot.failed_starts >= MAX_FAILED_STARTS:
                raise WorkerStartupError(f"{reason} ({MAX_FAILED_STARTS} failed starts in a row)") from None
            log.warning("%s; starting it again", reason)
            self._launch(slot)
            return
        assert self._workload is not None  # set by start() before any actor is launched
        _check_frozen_base(slot.name, details, self._workload, self._frozen_hash)
        slot.starting, slot.failed_starts = None, 0
        slot.started_at = time.monotonic()
        log.debug("ray worker %s ready: %s", slot.name, details)

    def _check_stalled(self, all_needed: bool) -> None:
        """A start that takes longer than ``start_timeout_s`` ends the run when no actor can train (or at the
        start of the run, when all are needed); otherwise the round goes on without it (a cluster that lost a
        node has no room for the replacement until a node joins) and the log says so once."""
        now = time.monotonic()
        stalled = [s for s in self._slots if s.starting is not None and now - s.launched_at > self.start_timeout_s]
        if not stalled:
            return
        if all_needed or all(s.starting is not None for s in self._slots):
            raise WorkerStartupError(
                f"Ray worker {stalled[0].name} was not ready after {self.start_timeout_s:g} s; does the cluster have "
                f"{self.threads} CPU(s) and {self.num_gpus_per_worker:g} GPU(s) per worker free? "
                "(executor.start_timeout_s)"
            )
        ready = sum(s.starting is None for s in self._slots)
        for slot in stalled:
            if not slot.waiting_said:
                log.warning(
                    "Ray worker %s waits for room on the cluster (a node lost?); going on with %d worker(s)",
                    slot.name,
                    ready,
                )
                slot.waiting_said = True

    def fit(self, global_params: torch.Tensor, tasks: Sequence[FitTask]) -> list[TaskResult]:
        return self._run(global_params, tasks, "fit")

    def evaluate(self, global_params: torch.Tensor, tasks: Sequence[EvalTask]) -> list[EvalResult | ClientFailure]:
        return self._run(global_params, tasks, "evaluate")

    def _run(self, global_params: torch.Tensor, tasks: Sequence[FitTask | EvalTask], what: str) -> list:
        """Run ``tasks`` (training or evaluation: the actor tells them apart) with the same queueing, retries and
        timeouts; results sorted by each task's (first) client."""
        if not self._slots:
            raise RuntimeError(f"RayExecutor.{what} called before start()")
        global_ref = [self._ray.put(to_array(global_params))]  # once per round, shared by every task
        pending = deque(sorted(tasks, key=lambda t: t.client_id))
        attempts: dict[int, int] = {}
        results: dict[int, TaskResult | EvalResult] = {}
        previous = torch.get_num_threads()
        torch.set_num_threads(1)  # as in the process executor: the actors own the cores while they train
        try:
            while pending or any(s.queue for s in self._slots):
                self._submit(global_ref, pending)
                self._wait(results, pending, attempts, all_needed=False)
        finally:
            torch.set_num_threads(previous)
        return [results[cid] for cid in sorted(results)]

    def _submit(self, global_ref: list[Any], pending: deque[FitTask | EvalTask]) -> None:
        """Give every idle ready actor a task; while at least one task per ready actor remains, queue a second
        one behind each running task, so that an actor starts its next client without waiting for the driver
        to see the previous result. The last tasks go only to idle actors (dynamic balancing)."""
        ready = [slot for slot in self._slots if slot.starting is None]
        for depth in (1, 2):
            for slot in ready:
                if len(slot.queue) < depth and pending and (depth == 1 or len(pending) >= len(ready)):
                    task = pending.popleft()
                    if not slot.queue:
                        slot.started_at = time.monotonic()
                    slot.queue.append((task, slot.actor.fit.remote(global_ref, task)))

    def _wait(
        self,
        results: dict[int, TaskResult | EvalResult],
        pending: deque[FitTask | EvalTask],
        attempts: dict[int, int],
        *,
        all_needed: bool,
    ) -> None:
        """Wait briefly for a finished task or a starting actor; handle results, dead actors, timeouts and starts."""
        ray = self._ray
        running = {s.queue[0][1]: s for s in self._slots if s.queue}  # an actor runs its tasks in order
        starting = {s.starting: s for s in self._slots if s.starting is not None}
        ready, _ = ray.wait([*running, *starting], num_returns=1, timeout=0.2)
        for ref in ready:
            if ref in starting:
                self._started(starting[ref])
                continue
            slot = running[ref]
            try:
                result, params = ray.get(ref)
            except ray.exceptions.RayError as error:  # the actor died: crash, kill, OOM, node lost
                self._replace(slot, results, pending, attempts, death_reason(ray, slot.name, error))
                continue
            results[result.client_id] = result if params is None else replace(result, params=to_tensor(params))
            slot.queue.popleft()
            slot.started_at = time.monotonic()
        now = time.monotonic()
        for slot in self._slots:
            if slot.queue and self.client_timeout_s is not None and now - slot.started_at > self.client_timeout_s:
                self._replace(slot, results, pending, attempts, f"client timed out after {self.client_timeout_s:g} s")
        self._check_stalled(all_needed)

    def _replace(
        self,
        slot: _Slot,
        results: dict[int, TaskResult | EvalResult],
        pending: deque[FitTask | EvalTask],
        attempts: dict[int, int],
        reason: str,
    ) -> None:
        """Kill the slot's actor, start a fresh one in its place (in the background), retry or fail its running
        task and put the tasks queued behind it (which never started) back in line."""
        task = slot.queue.popleft()[0]
        log.warning(
            "round %d client %d: %s; replacing Ray worker %s", task.round_num, task.client_id, reason, slot.name
        )
        kill_quietly(self._ray, slot.actor)
        pending.extendleft(reversed([queued for queued, _ in slot.queue]))
        slot.queue.clear()
        self._launch(slot)
        retry_or_fail(task, reason, slot.name, self.max_retries, attempts, pending, results)

    def close(self) -> None:
        """Kill every actor, or with ``reuse_actors`` keep the idle, healthy ones for the next run; shut Ray down only
        if this executor started it and keeps no actors. Safe to call twice."""
        ray = self._ray
        idle = [s for s in self._slots if s.starting is None and not s.queue] if self.reuse_actors else []
        for slot in self._slots:
            if slot in idle:
                slot.actor.release.remote()
            else:
                kill_quietly(ray, slot.actor)
        if idle and ray.is_initialized():
            ray_warm.keep(ray, self.threads, self.num_gpus_per_worker, [slot.actor for slot in idle])
        self._slots, self._workload_ref, self._workload, self._actor_cls = [], None, None, None
        if self._owns_ray and not idle and ray.is_initialized():
            ray.shutdown()
        self._owns_ray = False
