"""ProcessExecutor: persistent worker processes, pinned to devices, that train clients in parallel.

Workers are spawned once per run and build their model once. Each round the global weights are
copied once into a shared-memory buffer that every worker reads; each worker writes its flat update
into its own shared result buffer. Only small records (tasks, metrics) travel through pipes.
A worker that dies or exceeds ``client_timeout_s`` is replaced and its client retried with the same
seed (at most ``max_retries`` times), so a fault changes nothing in the results.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedsim.core.checks import integer
from fedsim.core.params import flatten
from fedsim.core.progress import progress
from fedsim.core.types import ClientFailure, ClientUpdate, EvalResult, EvalTask, FitTask, TaskResult
from fedsim.executor.base import MAX_FAILED_STARTS, Executor, Workload, retry_or_fail
from fedsim.executor.placement import physical_cores, plan_workers, resolve_devices
from fedsim.executor.process.early import EarlyStart
from fedsim.executor.process.forkserver import worker_context
from fedsim.executor.process.frozen import shared_frozen_base
from fedsim.executor.process.pool import WorkerHandle, WorkerStartupError, check_sendable, launch_worker, small_message

if TYPE_CHECKING:
    from multiprocessing.context import ForkServerContext, SpawnContext

log = logging.getLogger("fedsim")


class ProcessExecutor(Executor):
    """Runs client tasks in ``workers`` spawned processes.

    ``devices``: ``"auto"`` (every GPU, else CPU), ``"cpu"``, ``"cuda:0"`` or a list; workers are
    assigned round-robin. ``workers`` sets the total; otherwise ``workers_per_device`` (default: one per
    ``threads`` physical cores on CPU, one per GPU). ``threads`` is every worker's intra-op thread count;
    results equal the serial executor's with the same ``threads``. ``client_timeout_s`` bounds one task;
    ``max_retries`` bounds how often a task whose worker died or timed out is run again.
    """

    def __init__(
        self,
        *,
        devices: str | Sequence[str] = "auto",
        workers: int | None = None,
        workers_per_device: int | None = None,
        client_timeout_s: float | None = None,
        threads: int = 1,
        max_retries: int = 2,
        start_timeout_s: float = 300.0,
    ) -> None:
        if client_timeout_s is not None and client_timeout_s <= 0:
            raise ValueError(f"executor.client_timeout_s must be > 0 or null (got {client_timeout_s})")
        integer("executor.max_retries", max_retries, 0)
        self.plan = plan_workers(resolve_devices(devices), workers, workers_per_device, threads, physical_cores())
        self.client_timeout_s, self.max_retries, self.start_timeout_s = client_timeout_s, max_retries, start_timeout_s
        self._ctx: ForkServerContext | SpawnContext = worker_context()
        self._workers: list[WorkerHandle] = []
        self._early: EarlyStart | None = None
        self._workload: Workload | None = None
        self._global: torch.Tensor | None = None
        self._frozen: dict[str, torch.Tensor] = {}  # the frozen base, built once here, shared with the workers

    @property
    def workers(self) -> list[WorkerHandle]:
        """The live workers (for inspection: pid, device, name)."""
        return list(self._workers)

    def prepare(self, model_factory: Callable[[], nn.Module], log_dir: Path | None = None) -> None:
        """Fork the workers now and have them build ``model_factory``'s model while the caller builds the rest of
        the run (:class:`~fedsim.executor.process.early.EarlyStart`); :meth:`start` then only sends them the
        workload. Does nothing once started, or for a factory that cannot be pickled (:meth:`start` says why).
        An executor dropped unstarted (a server built and never run) closes their pipes when it is collected, and
        they exit."""
        if self._workers or self._early is not None:
            return
        try:
            self._early = EarlyStart(self._ctx, self.plan, model_factory, log_dir)
        except Exception:  # noqa: BLE001 - not picklable: start() refuses it in one line
            self._early = None

    def start(self, workload: Workload) -> None:
        began = time.perf_counter()
        check_sendable(workload)
        with torch.random.fork_rng(devices=[]), progress("building the model", None, "step"):  # the caller's RNG stays
            model = workload.model_factory()
            numel, self._frozen = flatten(model).numel(), shared_frozen_base(model)
            del model
        workload.train_data.x.share_memory_()
        workload.train_data.y.share_memory_()
        self._workload = workload
        self._global = torch.zeros(numel).share_memory_()
        launched: list[WorkerHandle] = []
        try:
            with progress("starting process workers (each builds the model)", len(self.plan), "worker") as ready:
                launched = self._launch_all(workload)
                for worker in launched:
                    self._workers.append(self._ready_or_restart(worker))
                    check_frozen_base(self._workers[-1], workload)
                    ready(1)
            log.info("%d process workers ready in %.2f s", len(self._workers), time.perf_counter() - began)
        except BaseException:
            for worker in launched[len(self._workers) :]:  # started, never awaited
                worker.kill()
            self.close()
            raise

    def _launch_all(self, workload: Workload) -> list[WorkerHandle]:
        """Every worker, sent the run: those :meth:`prepare` started (if they build this workload's model), else new."""
        early, self._early = self._early, None
        handles = early.take(workload) if early is not None else None
        if handles is None:
            return [self._launch(index) for index in range(len(self.plan))]
        assert self._global is not None
        for handle in handles:
            handle.send_start(workload, self._global, self._frozen)
        return handles

    def _ready_or_restart(self, worker: WorkerHandle) -> WorkerHandle:
        """``worker`` once it is ready, or a fresh one in its slot if it is killed or stalls while starting; after
        ``MAX_FAILED_STARTS`` failed starts in a row, or at once when it exits by itself (it would again),
        :class:`WorkerStartupError` (one line) ends the run."""
        for attempt in range(1, MAX_FAILED_STARTS + 1):
            try:
                worker.await_ready(self.start_timeout_s)
                return worker
            except WorkerStartupError as error:
                if not error.retryable:
                    raise
                if attempt == MAX_FAILED_STARTS:
                    raise WorkerStartupError(f"{error} ({MAX_FAILED_STARTS} failed starts in a row)") from None
                log.warning("%s; starting it again", error)
                worker = self._launch(worker.index)
        raise AssertionError("unreachable")

    def _launch(self, index: int) -> WorkerHandle:
        """Fork worker ``index`` from the forkserver. If the forkserver is killed (by the OOM killer, say) while it
        forks, this executor spawns its workers from then on: a new forkserver would need seconds of imports
        before its first fork, and it would be one more process whose death stops every start."""
        assert self._workload is not None and self._global is not None
        device, threads = self.plan[index]
        try:
            return launch_worker(self._ctx, index, device, threads, self._workload, self._global, self._frozen)
        except (EOFError, ConnectionError) as error:
            if self._ctx.get_start_method() != "forkserver":
                raise
            log.warning(
                "worker w%d could not be forked: the forkserver died (%s); spawning workers from now on",
                index,
                type(error).__name__,
            )
            self._ctx = mp.get_context("spawn")
            return launch_worker(self._ctx, index, device, threads, self._workload, self._global, self._frozen)

    def fit(self, global_params: torch.Tensor, tasks: Sequence[FitTask]) -> list[TaskResult]:
        return self._run(global_params, tasks, "fit")

    def evaluate(self, global_params: torch.Tensor, tasks: Sequence[EvalTask]) -> list[EvalResult | ClientFailure]:
        return self._run(global_params, tasks, "evaluate")

    def _run(self, global_params: torch.Tensor, tasks: Sequence[FitTask | EvalTask], what: str) -> list:
        """Run ``tasks`` (training or evaluation: the worker tells them apart) on the workers, with the same
        queueing, retries and timeouts; results sorted by each task's (first) client."""
        if self._global is None:
            raise RuntimeError(f"ProcessExecutor.{what} called before start()")
        self._global.copy_(global_params)
        pending = deque(sorted(tasks, key=lambda t: t.client_id))
        attempts: dict[int, int] = {}
        results: dict[int, TaskResult | EvalResult] = {}
        previous = torch.get_num_threads()
        torch.set_num_threads(1)  # the workers own the cores while they train; the parent only copies results
        try:
            while pending or any(w.task is not None for w in self._workers):
                self._assign(pending)
                self._collect(results, pending, attempts)
        finally:
            torch.set_num_threads(previous)
        return [results[cid] for cid in sorted(results)]

    def _assign(self, pending: deque[FitTask | EvalTask]) -> None:
        """Give every idle worker a task; then queue one more behind a busy worker's only while at least
        one task per worker is left, so that the round's last tasks go to whichever worker is free first."""
        for worker in self._workers:
            if worker.task is None and pending:
                worker.assign(pending.popleft())
        for worker in self._workers:
            if worker.has_room and len(pending) >= len(self._workers) and small_message(pending[0]):
                worker.assign(pending.popleft())

    def _collect(
        self, results: dict[int, TaskResult | EvalResult], pending: deque[FitTask | EvalTask], attempts: dict[int, int]
    ) -> None:
        """Wait briefly for results, deaths or timeouts of busy workers and handle each."""
        busy = [w for w in self._workers if w.task is not None]
        ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout=0.2))
        for worker in busy:
            if worker.conn in ready and worker.poll_result():
                result = worker.take_result()
                results[result.client_id] = result
            elif worker.conn in ready or worker.process.sentinel in ready or not worker.process.is_alive():
                self._replace(worker, results, pending, attempts, worker.death_reason())
            elif self.client_timeout_s is not None and time.monotonic() - worker.started_at > self.client_timeout_s:
                self._replace(worker, results, pending, attempts, f"client timed out after {self.client_timeout_s:g} s")

    def _replace(
        self,
        worker: WorkerHandle,
        results: dict[int, TaskResult | EvalResult],
        pending: deque[FitTask | EvalTask],
        attempts: dict[int, int],
        reason: str,
    ) -> None:
        """Kill ``worker``, start a fresh one in its slot, retry or fail the task it was training, and put the
        tasks queued behind it (never started) back at the front of ``pending``."""
        task = worker.task
        assert task is not None
        pending.extendleft(reversed(worker.queued()))
        worker.kill()
        log.warning("round %d client %d: %s; replacing the worker", task.round_num, task.client_id, reason)
        slot = self._workers.index(worker)
        self._workers[slot] = self._ready_or_restart(self._launch(worker.index))
        retry_or_fail(task, reason, worker.name, self.max_retries, attempts, pending, results)

    def close(self) -> None:
        """Stop every worker (politely, then by force) and release shared memory; safe to call twice."""
        began, stopped = time.perf_counter(), len(self._workers)
        if self._early is not None:
            self._early.cancel()
            self._early = None
        for worker in self._workers:
            worker.stop()
        for worker in self._workers:
            worker.join_or_kill(timeout=5.0)
        if stopped:
            log.info("%d process workers stopped in %.2f s", stopped, time.perf_counter() - began)
        self._workers = []
        self._global = None
        self._workload = None


__all__ = ["ClientUpdate", "ProcessExecutor", "WorkerStartupError"]


def check_frozen_base(worker: WorkerHandle, workload: Workload) -> None:
    """Refuse, in one line, a worker whose model's frozen weights (a LoRA model's base, which never travels) differ
    from the ones the server's process built and shared (the worker compared them): its updates would be adapters
    of another model."""
    differs = worker.info.get("frozen_differs")
    if differs is not None:
        name = getattr(workload.model_factory, "func", workload.model_factory)
        raise WorkerStartupError(
            f"model: worker {worker.info.get('pid')} built a frozen base different from the server's ({differs}) "
            f"with {getattr(name, '__qualname__', name)}; the model factory must build "
            "the same frozen weights everywhere (seed them from the run seed, load them from the same model.path)"
        )
