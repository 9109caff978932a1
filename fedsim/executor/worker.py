"""The body of one worker process of :class:`~fedsim.executor.process.ProcessExecutor`.

A worker is pinned to its device and thread budget before it touches CUDA or builds anything, builds
its model once, then loops: receive a task over its pipe, load the round's global weights from
shared memory, train, write the flat update into its own shared result buffer, send the small
result record back. Everything it prints or logs goes to its own log file, tagged with round and client.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TextIO

import torch

from fedsim.data.tensor_data import TensorData
from fedsim.executor.base import Workload, run_task
from fedsim.types import ClientUpdate, FitTask

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class WorkerSpec:
    """Where and how one worker runs. ``log_path=None`` sends its output to the parent's stderr."""

    name: str
    device: str
    num_threads: int
    log_path: Path | None = None


class _TaskTag(logging.Filter):
    """Adds ``[round R client C]`` (or ``[idle]``) to every record of the worker's log."""

    task: FitTask | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        task = _TaskTag.task
        record.task = f"round {task.round_num} client {task.client_id}" if task else "idle"
        return True


class _TaggedStream:
    """A text stream that prefixes every line printed by client code with the current task."""

    def __init__(self, sink: TextIO) -> None:
        self.sink, self._at_line_start = sink, True

    def write(self, text: str) -> int:
        for piece in text.splitlines(keepends=True):
            if self._at_line_start:
                task = _TaskTag.task
                self.sink.write(f"[round {task.round_num} client {task.client_id}] " if task else "[idle] ")
            self.sink.write(piece)
            self._at_line_start = piece.endswith("\n")
        self.sink.flush()
        return len(text)

    def flush(self) -> None:
        self.sink.flush()


def worker_main(spec: WorkerSpec, workload: Workload, global_params: torch.Tensor, result_buffer: torch.Tensor, conn: Connection) -> None:
    """Entry point of a worker process (spawned; all arguments arrive pickled once, tensors as shared memory)."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops us cleanly
    device = _pin(spec)
    log = _redirect_output(spec)
    model = workload.model_factory().to(device)
    data = _to_device(workload.train_data, device)
    _warm_up(model, data)
    log.info("worker %s ready on %s (pid %d, %d threads)", spec.name, device, os.getpid(), torch.get_num_threads())
    conn.send(("ready", {"pid": os.getpid(), "device": str(device)}))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            break  # the parent is gone
        if task is None:
            break
        _TaskTag.task = task
        result = run_task(model, workload.clients[task.client_id], data, global_params, task, spec.name, workload.local)
        if isinstance(result, ClientUpdate):
            result_buffer.copy_(result.params)
            result = replace(result, params=torch.empty(0))
            log.info("trained: %d examples, train loss %.4f", result.num_examples, result.metrics.get("train_loss", float("nan")))
        else:
            log.error("failed:\n%s", result.traceback)
        _TaskTag.task = None
        conn.send(("result", result))


def _warm_up(model: torch.nn.Module, data: TensorData) -> None:
    """Pay one-time costs (lazy imports behind the first optimizer, first backward) before reporting ready,
    so that they do not land in the first round. Weights are overwritten by every task anyway."""
    with torch.random.fork_rng(devices=[]):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        loss = torch.nn.functional.cross_entropy(model(data.x[:2]), data.y[:2])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies, so no worker outlives a killed run."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass


def _pin(spec: WorkerSpec) -> torch.device:
    """Bind the thread budget and the device before anything initialises CUDA or a thread pool."""
    torch.set_num_threads(spec.num_threads)
    torch.set_num_interop_threads(1)
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def _redirect_output(spec: WorkerSpec) -> logging.Logger:
    """Route this worker's prints and log records into its own file, tagged with round and client."""
    handler: logging.Handler
    if spec.log_path is not None:
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        stream = open(spec.log_path, "a", encoding="utf-8", buffering=1)
        sys.stdout = sys.stderr = _TaggedStream(stream)  # type: ignore[assignment]
        handler = logging.StreamHandler(stream)
    else:  # no run directory: only warnings and failures reach the console
        handler = logging.StreamHandler(sys.__stderr__)
        handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter(f"%(asctime)s [{spec.name}] [%(task)s] %(levelname)s %(message)s"))
    handler.addFilter(_TaskTag())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    return logging.getLogger(f"fedsim.worker.{spec.name}")


def _to_device(data: TensorData, device: torch.device) -> TensorData:
    """Keep CPU data in shared memory as is; copy it to a GPU once per worker."""
    if device.type == "cpu":
        return data
    return replace(data, x=data.x.to(device), y=data.y.to(device))
