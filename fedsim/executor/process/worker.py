"""The body of one worker process of :class:`~fedsim.executor.process.ProcessExecutor`.

A worker is pinned to its device and thread budget before it touches CUDA or builds anything, builds
its model once, then loops: receive a task over its pipe, load the round's global weights from
shared memory, train, write the flat update into its own shared result buffer, send the small
result record back. Everything it prints or logs goes to its own log file, tagged with round and client.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path

import torch

from fedsim.core.params import fixed_state
from fedsim.core.types import ClientUpdate, EvalResult, EvalTask, TaskResult
from fedsim.data.tensor_data import TensorData
from fedsim.executor.base import run_task, warm_up
from fedsim.executor.eval_task import run_eval_task
from fedsim.executor.process.frozen import adopt_frozen_base
from fedsim.executor.worker_log import hold_output, log_result, redirect_output, tagged

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class WorkerSpec:
    """Where and how one worker runs. ``log_path=None`` sends its output to the parent's stderr."""

    name: str
    device: str
    num_threads: int
    log_path: Path | None = None


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Entry point of a worker process. Spawned with only ``spec`` and its pipe, so that the spawn payload stays
    far below a pipe's buffer and starting a worker can never block the parent. The first message on the pipe may
    be ``("model", model_factory)``, sent while the server is still building the run: the worker builds its model
    (imports included) meanwhile. Then comes the run's ``(workload, global_params, result_buffers, frozen)``,
    tensors as shared memory (its model factory is used only if no model came first); ``frozen``, the frozen base
    the parent built, replaces the model's own (:func:`~fedsim.executor.process.frozen.adopt_frozen_base`).

    Each later message is ``(task, slot)``: the update's weights go into ``result_buffers[slot]``, which the
    parent hands out so that a queued task never overwrites a result it has not read yet."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops us cleanly
    device = _pin(spec)
    hold_output(spec.name)  # no log file before the run is sent: a worker started early for a refused run has none
    try:
        received = _receive_run(conn, device)
    except BaseException:
        redirect_output(spec.name, spec.log_path)  # what was held, then the traceback, go to the worker's log
        raise
    if received is None:
        return  # the parent gave up on this start
    model, (workload, global_params, result_buffers, frozen), early = received
    log = redirect_output(spec.name, spec.log_path)
    differs = adopt_frozen_base(model, frozen, device)  # before fixed_state and the warm-up: they use the model
    fixed = fixed_state(model)  # before the warm-up step, which counts a batch in BatchNorm's num_batches_tracked
    data = _to_device(workload.train_data, device)
    warm_up(model, data)
    built = "; model built while the run was being built" if early else ""
    threads = torch.get_num_threads()
    log.info("worker %s ready on %s (pid %d, %d threads%s)", spec.name, device, os.getpid(), threads, built)
    conn.send(("ready", {"pid": os.getpid(), "device": str(device), "frozen_differs": differs}))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break  # the parent is gone
        if message is None:
            break
        task, slot = message
        with tagged(task):
            result: TaskResult | EvalResult
            if isinstance(task, EvalTask):
                result = run_eval_task(
                    model, workload.clients, data, global_params, task, spec.name, workload.local, fixed
                )
            else:
                result = run_task(
                    model, workload.clients[task.client_id], data, global_params, task, spec.name, workload.local, fixed
                )
            log_result(log, result)
        if isinstance(result, ClientUpdate) and fits(result.params, result_buffers[slot]):
            result_buffers[slot].copy_(result.params)
            # no tensor in the pipe: torch's reducer would move even an empty one through shared memory
            # and fd passing (~0.15 ms per task, measured); the parent puts the buffer's copy back
            result = replace(result, params=None)  # type: ignore[arg-type]  # None only in the pipe (see above)
        # an update that does not fit the buffer (wrong shape or dtype, not a tensor) travels as it is: the
        # server rejects it with the same reason as under every other executor
        conn.send(("result", result))
    _exit_promptly()


def _receive_run(conn: Connection, device: torch.device) -> tuple[torch.nn.Module, tuple, bool] | None:
    """The model (built from a first ``("model", factory)`` message, else from the workload's factory), the
    run's message and whether the model came first; ``None`` when the pipe closes first."""
    try:
        message = conn.recv()
        model = None
        if isinstance(message, tuple) and len(message) == 2 and message[0] == "model":
            model = message[1]().to(device)
            message = conn.recv()
    except (EOFError, OSError):
        return None
    if model is None:
        return message[0].model_factory().to(device), message, False
    return model, message, True


def _exit_promptly() -> None:
    """Exit 0 now that the parent said stop (or is gone), without Python's interpreter teardown: unloading torch
    and freeing the model took ~1.2 s per worker, and ``close()`` waited for it. What was printed or logged is
    flushed first; the shared tensors belong to the parent."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)


def fits(params: object, buffer: torch.Tensor) -> bool:
    """Whether ``params`` can go through the shared result buffer unchanged (a CPU tensor of its shape and dtype)."""
    return isinstance(params, torch.Tensor) and params.shape == buffer.shape and params.dtype == buffer.dtype


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies, so that no worker outlives a killed run. The
    parent is the forkserver, which exits when the run's main process does; and a forkserver that dies takes
    its workers along, which the executor sees (their status pipes close) and replaces."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _pin(spec: WorkerSpec) -> torch.device:
    """Bind the thread budget and the device before anything initialises CUDA or a thread pool."""
    torch.set_num_threads(spec.num_threads)
    torch.set_num_interop_threads(1)
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def _to_device(data: TensorData, device: torch.device) -> TensorData:
    """Keep CPU data in shared memory as is; copy it to a GPU once per worker."""
    if device.type == "cpu":
        return data
    return replace(data, x=data.x.to(device), y=data.y.to(device))
