"""Starting, talking to and stopping one worker process (the parent's side of the pipe)."""

from __future__ import annotations

import pickle
import signal
import sys
import time
from dataclasses import replace
from multiprocessing import current_process
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnContext
from multiprocessing.process import BaseProcess
from typing import Any

import torch

from fedsim.executor.base import Workload
from fedsim.executor.worker import WorkerSpec, worker_main
from fedsim.types import ClientUpdate, FitTask, TaskResult

NO_MAIN_GUARD = (
    "fedsim: a worker process was started while your script was being imported by another worker: "
    'put the code that runs the experiment under `if __name__ == "__main__":` (needed by the spawn start method)'
)


POSSIBLY_OOM = "possibly out of memory"  # the OS OOM killer sends SIGKILL, but so do people and other tools


class WorkerStartupError(RuntimeError):
    """A worker process exited or stalled before it was ready to train."""


class WorkerHandle:
    """The parent's view of one worker: its process, pipe, shared result buffer and current task."""

    def __init__(self, index: int, spec: WorkerSpec, process: BaseProcess, conn: Connection, result_buffer: torch.Tensor) -> None:
        self.index, self.spec, self.process, self.conn, self.result_buffer = index, spec, process, conn, result_buffer
        self.task: FitTask | None = None
        self.started_at = 0.0
        self.info: dict[str, Any] = {}
        self._message: tuple[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def await_ready(self, timeout: float) -> None:
        """Block until the worker reports ready; raise :class:`WorkerStartupError` if it dies or stalls."""
        ready = wait([self.conn, self.process.sentinel], timeout=timeout)
        if self.conn in ready and self.poll_result() and self._message and self._message[0] == "ready":
            self.info, self._message = self._message[1], None
            return
        self.kill()
        where = f"; see {self.spec.log_path}" if self.spec.log_path else ""
        state = f"exited with code {self.process.exitcode}" if ready else f"was not ready after {timeout:g} s"
        raise WorkerStartupError(
            f"worker {self.name} ({self.spec.device}) {state} before it could train{where}. "
            'If a script starts fedsim, keep its experiment code under `if __name__ == "__main__":`'
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

    def assign(self, task: FitTask) -> None:
        self.conn.send(task)
        self.task, self.started_at = task, time.monotonic()

    def poll_result(self) -> bool:
        """Read one message if the pipe has one; False when the pipe broke (the worker died)."""
        try:
            self._message = self.conn.recv()
        except (EOFError, OSError):
            return False
        return True

    def take_result(self) -> TaskResult:
        """The result just received, with the update's weights copied out of the shared buffer."""
        assert self._message is not None and self._message[0] == "result"
        result: TaskResult = self._message[1]
        if isinstance(result, ClientUpdate):
            result = _with_params(result, self.result_buffer.clone())
        self._message, self.task = None, None
        return result

    def stop(self) -> None:
        """Ask the worker to exit after its current task."""
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass

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


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _with_params(update: ClientUpdate, params: torch.Tensor) -> ClientUpdate:
    return replace(update, params=params)


def launch_worker(ctx: SpawnContext, index: int, device: str, threads: int, workload: Workload, global_params: torch.Tensor) -> WorkerHandle:
    """Spawn worker ``index``; returns at once (call :meth:`WorkerHandle.await_ready`)."""
    if getattr(current_process(), "_inheriting", False):
        print(NO_MAIN_GUARD, file=sys.stderr)
        raise SystemExit(1)
    log_path = workload.log_dir / "workers" / f"worker-{index}.log" if workload.log_dir is not None else None
    spec = WorkerSpec(name=f"w{index}", device=device, num_threads=threads, log_path=log_path)
    result_buffer = torch.zeros_like(global_params).share_memory_()
    parent_conn, child_conn = ctx.Pipe(duplex=True)
    process = ctx.Process(
        target=worker_main, args=(spec, workload, global_params, result_buffer, child_conn),
        name=f"fedsim-worker-{index}", daemon=True,
    )
    process.start()
    child_conn.close()
    return WorkerHandle(index, spec, process, parent_conn, result_buffer)


def check_sendable(workload: Workload) -> None:
    """Fail before any training if a piece of the workload cannot reach a spawned worker."""
    pieces: dict[str, object] = {"the model factory": workload.model_factory}
    if workload.local is not None:
        pieces[f"the strategy's client half {type(workload.local).__qualname__}"] = workload.local
    for client in workload.clients:
        pieces.setdefault(f"client class {type(client).__qualname__}", client)
        if len(pieces) > 8:
            break
    for what, obj in pieces.items():
        _check_one(what, obj)


def _check_one(what: str, obj: object) -> None:
    main = sys.modules.get("__main__")
    hint = ("define it at module level in an importable .py file (not in a notebook, a lambda or inside a "
            "function), or use executor=serial")
    for cls in {type(obj), getattr(obj, "func", None), getattr(getattr(obj, "func", None), "func", None)}:
        if isinstance(cls, type) and cls.__module__ == "__main__" and not getattr(main, "__file__", None):
            raise TypeError(f"ProcessExecutor cannot send {what} ({cls.__qualname__}) to worker processes: "
                            f"it lives in an interactive session; {hint}")
    try:
        pickle.dumps(obj)
    except Exception as error:  # noqa: BLE001 - any pickling failure gets the same advice
        raise TypeError(f"ProcessExecutor cannot send {what} to worker processes ({type(error).__name__}: {error}); {hint}") from None
