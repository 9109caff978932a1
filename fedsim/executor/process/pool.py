"""Starting, talking to and stopping one worker process (the parent's side of the pipe)."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from multiprocessing import current_process
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedsim.client.federation import representatives
from fedsim.core.errors import WorkerStartupError
from fedsim.core.types import ClientUpdate, EvalResult, EvalTask, FitTask, TaskResult
from fedsim.executor.base import POSSIBLY_OOM, Workload
from fedsim.executor.process import by_value
from fedsim.executor.process.worker import WorkerSpec, worker_main

if TYPE_CHECKING:
    from multiprocessing.context import ForkServerContext, SpawnContext

NO_MAIN_GUARD = (
    "fedsim: a worker process was started while your script was being imported by another worker: "
    'put the code that runs the experiment under `if __name__ == "__main__":` (needed by the spawn start method)'
)


QUEUE_DEPTH = 2  # tasks a worker holds at once: the one it trains, and the next, already in its pipe


class WorkerHandle:
    """The parent's view of one worker: its process, pipe, shared result buffers and tasks in flight.

    A worker may hold a second task behind the one it trains, so it starts it without waiting for the
    parent to read the result and send the next (gap between tasks 0.45 → 0.31 ms, task_gap.py). Each task
    in flight has its own result buffer (``slot``), so the queued task cannot overwrite a result the
    parent has not copied out yet. Results come back in the order the tasks were sent.
    """

    def __init__(self, index: int, spec: WorkerSpec, process: BaseProcess, conn: Connection) -> None:
        self.index, self.spec, self.process, self.conn = index, spec, process, conn
        self.result_buffers: tuple[torch.Tensor, ...] = ()  # set by send_start
        self.in_flight: deque[tuple[FitTask | EvalTask, int]] = deque()  # (task, result slot), oldest first
        self.started_at = 0.0  # when the oldest task in flight started training
        self.info: dict[str, Any] = {}
        self._message: tuple[str, Any] | None = None
        self._sender: threading.Thread | None = None
        self._send_error: BaseException | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def send_model(self, payload: bytes) -> None:
        """Send ``("model", model_factory)`` pickled (:func:`model_message`): the worker builds its model while the
        run's other parts are still being built; its workload follows with :meth:`send_start`."""
        self.conn.send_bytes(payload)

    def send_start(self, workload: Workload, global_params: torch.Tensor, frozen: dict[str, torch.Tensor]) -> None:
        """Send the run's workload, the shared global weights, the shared frozen base
        (:mod:`~fedsim.executor.process.frozen`) and this worker's own result buffers (made here), from a thread
        (it is large: a worker that stalls before reading it must not block the parent); :meth:`await_ready` bounds
        the wait and a dead worker breaks the pipe."""
        self.result_buffers = tuple(torch.zeros_like(global_params).share_memory_() for _ in range(QUEUE_DEPTH))
        payload = by_value.dumps((workload, global_params, self.result_buffers, frozen))  # a pickling error is ours

        def send() -> None:
            try:
                self.conn.send_bytes(payload)
            except (OSError, ValueError) as error:  # the worker died (broken pipe) or was killed (pipe closed)
                self._send_error = error

        self._sender = threading.Thread(target=send, name=f"fedsim-start-{self.name}", daemon=True)
        self._sender.start()

    def await_ready(self, timeout: float) -> None:
        """Block until the worker reports ready; raise :class:`WorkerStartupError` (one line) if it dies or stalls."""
        ready = wait([self.conn, self.process.sentinel], timeout=timeout)
        if self.conn in ready and self.poll_result() and self._message and self._message[0] == "ready":
            self.info, self._message = self._message[1], None
            return
        self.kill()
        if self._sender is not None:
            self._sender.join(5.0)  # the pipe is closed: the send ends at once
        where = f"; see {self.spec.log_path}" if self.spec.log_path else ""
        code = self.process.exitcode
        if not ready or code is None:
            state = f"was not ready after {timeout:g} s"
        elif code < 0:
            state = f"was killed by {_signal_name(-code)}" + (f" ({POSSIBLY_OOM})" if -code == signal.SIGKILL else "")
        else:
            state = f"exited with code {code}"
        hint = (
            '. If a script starts fedsim, keep its experiment code under `if __name__ == "__main__":`'
            if ready and code is not None and code >= 0
            else ""
        )
        raise WorkerStartupError(
            f"worker {self.name} ({self.spec.device}) {state} before it could train{where}{hint}",
            retryable=not ready or code is None or code < 0,
        )

    def death_reason(self) -> str:
        """One line saying how the worker ended (its pipe broke or its process exited)."""
        self.process.join(1.0)  # a broken pipe can come a moment before the exit status
        code = self.process.exitcode
        if code is None:
            return f"worker {self.name} stopped answering (pipe closed, process still running)"
        if code >= 0:
            return f"worker {self.name} exited with code {code}"
        name = _signal_name(-code)
        if -code == signal.SIGKILL:
            return f"worker {self.name} was killed by {name} ({POSSIBLY_OOM})"
        return f"worker {self.name} was killed by {name}"

    @property
    def task(self) -> FitTask | EvalTask | None:
        """The task the worker is training now, or ``None`` when it is idle."""
        return self.in_flight[0][0] if self.in_flight else None

    @property
    def has_room(self) -> bool:
        return len(self.in_flight) < QUEUE_DEPTH

    def queued(self) -> list[FitTask | EvalTask]:
        """Tasks sent but not started yet (behind the one in training)."""
        return [task for task, _ in list(self.in_flight)[1:]]

    def assign(self, task: FitTask | EvalTask) -> None:
        """Send ``task``; it starts now if the worker is idle, else after the tasks already in flight."""
        used = {slot for _, slot in self.in_flight}
        slot = next(s for s in range(QUEUE_DEPTH) if s not in used)
        # OSError: the worker died a moment ago; its sentinel says so, and the task is retried from in_flight
        with contextlib.suppress(OSError):
            self.conn.send((task, slot))
        if not self.in_flight:
            self.started_at = time.monotonic()
        self.in_flight.append((task, slot))

    def poll_result(self) -> bool:
        """Read one message if the pipe has one; False when the pipe broke (the worker died)."""
        try:
            self._message = self.conn.recv()
        except (EOFError, OSError):
            return False
        return True

    def take_result(self) -> TaskResult | EvalResult:
        """The result just received (of the oldest task in flight), with the update's weights copied out of
        its shared buffer; the next task in flight, if any, has started training meanwhile."""
        assert self._message is not None and self._message[0] == "result"
        result: TaskResult | EvalResult = self._message[1]
        _, slot = self.in_flight.popleft()
        if isinstance(result, ClientUpdate) and result.params is None:  # else: an update the server will reject
            result = _with_params(result, self.result_buffers[slot].clone())
        self._message = None
        self.started_at = time.monotonic()
        return result

    def stop(self) -> None:
        """Ask the worker to exit after its current task."""
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)

    def join_or_kill(self, timeout: float) -> None:
        self.process.join(timeout)
        if self.process.is_alive():
            self.kill()
        self.conn.close()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5.0)
        self.conn.close()


SMALL_MESSAGE = 32 * 1024  # bytes a task may carry in-band and still wait in a busy worker's pipe


def small_message(task: FitTask | EvalTask) -> bool:
    """Whether ``task`` pickles small enough to wait in the pipe of a worker that is still training: a large
    one (a model-sized array in its config or state) would block the parent's send until the worker reads
    it, and with it every timeout. Tensors cross as shared memory and count for nothing."""
    values = (
        [v for state in task.states for v in state.values()]
        if isinstance(task, EvalTask)
        else [*task.config.values(), *task.state.values()]
    )
    arrays = [v for v in values if isinstance(v, np.ndarray)]
    return sum(a.nbytes for a in arrays) < SMALL_MESSAGE


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _with_params(update: ClientUpdate, params: torch.Tensor) -> ClientUpdate:
    return replace(update, params=params)


def model_message(model_factory: Callable[[], Any]) -> bytes:
    """The message of :meth:`WorkerHandle.send_model`; raises what pickling ``model_factory`` raises."""
    return by_value.dumps(("model", model_factory))


def spawn_worker(
    ctx: ForkServerContext | SpawnContext, index: int, device: str, threads: int, log_dir: Path | None
) -> WorkerHandle:
    """Start worker ``index``'s process; returns once it runs (a forked one waits for the forkserver's imports).

    The process gets only its spec and pipe: multiprocessing writes a process's arguments to it while still
    holding the reading end itself, so a payload larger than the pipe's buffer (the workload: ~190 KB) blocks
    the parent for good when the child dies before reading it. The model (:meth:`WorkerHandle.send_model`,
    optional) and the workload (:meth:`WorkerHandle.send_start`) follow over the worker's own pipe."""
    if getattr(current_process(), "_inheriting", False):
        print(NO_MAIN_GUARD, file=sys.stderr)
        raise SystemExit(1)
    log_path = log_dir / "workers" / f"worker-{index}.log" if log_dir is not None else None
    spec = WorkerSpec(name=f"w{index}", device=device, num_threads=threads, log_path=log_path)
    parent_conn, child_conn = ctx.Pipe(duplex=True)
    process = ctx.Process(target=worker_main, args=(spec, child_conn), name=f"fedsim-worker-{index}", daemon=True)
    process.start()
    child_conn.close()
    return WorkerHandle(index, spec, process, parent_conn)


def launch_worker(
    ctx: ForkServerContext | SpawnContext,
    index: int,
    device: str,
    threads: int,
    workload: Workload,
    global_params: torch.Tensor,
    frozen: dict[str, torch.Tensor],
) -> WorkerHandle:
    """Spawn worker ``index`` and send it the run; returns at once (call :meth:`WorkerHandle.await_ready`)."""
    handle = spawn_worker(ctx, index, device, threads, workload.log_dir)
    handle.send_start(workload, global_params, frozen)
    return handle


def check_sendable(workload: Workload) -> None:
    """Fail before any training if a piece of the workload cannot reach a spawned worker."""
    pieces: dict[str, object] = {"the model factory": workload.model_factory}
    if workload.local is not None:
        pieces[f"the strategy's client half {type(workload.local).__qualname__}"] = workload.local
    for client in representatives(workload.clients):  # not a million clients of one class
        pieces.setdefault(f"client class {type(client).__qualname__}", client)
        if len(pieces) > 8:
            break
    for what, obj in pieces.items():
        _check_one(what, obj)


def _check_one(what: str, obj: object) -> None:
    """Pickle ``obj`` as its start message will (classes and functions of a notebook by value)."""
    try:
        by_value.dumps(obj)
    except Exception as error:  # noqa: BLE001 - any pickling failure gets the same advice
        raise TypeError(
            f"ProcessExecutor cannot send {what} to worker processes ({type(error).__name__}: {error}); "
            "make it picklable (an open file, a lock or a generator cannot be pickled), or use executor=serial"
        ) from None
