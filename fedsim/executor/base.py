"""Executor: "run these fit tasks on these global weights, give me their results".

Every executor returns one result per task, sorted by client id, where a result is a
:class:`~fedsim.core.types.ClientUpdate` or a :class:`~fedsim.core.types.ClientFailure`. The serial executor
is the reference: every other executor must give the same answers.
"""

from __future__ import annotations

import traceback as tb
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType

import torch
from torch import nn

from fedsim.client.base import Client
from fedsim.client.local_training import LocalTraining
from fedsim.core.params import load_flat, restore_fixed_state
from fedsim.core.state_values import copy_state, state_problem
from fedsim.core.types import ClientFailure, ClientUpdate, EvalResult, EvalTask, FitTask, TaskResult
from fedsim.data.tensor_data import TensorData
from fedsim.executor import client_guard

MAX_FAILED_STARTS = 5  # failed starts of one worker slot in a row (killed while starting) before the run stops
POSSIBLY_OOM = "possibly out of memory"  # the OS OOM killer sends SIGKILL, but so do people and other tools


@dataclass(frozen=True)
class Workload:
    """What every worker needs once per run: how to build a model, the clients and the training data.

    ``log_dir``, when set, is where executors with worker processes write one log file per worker.
    ``local`` is the strategy's client half, used by every task.
    """

    model_factory: Callable[[], nn.Module]
    clients: Sequence[Client]
    train_data: TensorData
    log_dir: Path | None = None
    local: LocalTraining | None = None


class Executor(ABC):
    """Runs client tasks. Use as ``start(workload)`` … ``fit(...)`` per round … ``close()``."""

    @abstractmethod
    def start(self, workload: Workload) -> None:
        """Prepare workers (models, data) once per run."""

    def prepare(self, model_factory: Callable[[], nn.Module], log_dir: Path | None = None) -> None:  # noqa: B027
        """Optional: begin, in the background, what :meth:`start` will need of the model alone (the process
        executor forks its workers and has them build it), while the caller builds the rest of the run; ``log_dir``
        is the run directory (the workers' log files). :meth:`start` works whether or not this was called, and
        :meth:`close` undoes it. The server calls it once its settings are checked. The default does nothing."""

    def check(self, workload: Workload) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Refuse, with a ``ValueError`` of one line, a workload this executor cannot run; called when the server
        is built, before any work. The default accepts everything."""

    @abstractmethod
    def fit(self, global_params: torch.Tensor, tasks: Sequence[FitTask]) -> list[TaskResult]:
        """Train every task from ``global_params``; results sorted by client id."""

    def evaluate(self, global_params: torch.Tensor, tasks: Sequence[EvalTask]) -> list[EvalResult | ClientFailure]:
        """Score every task's clients with ``global_params`` (see :mod:`fedsim.executor.eval_task`), on the same
        workers as :meth:`fit`; results sorted by each task's first client. Every built-in executor has it."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot evaluate clients (evaluate_clients needs Executor.evaluate)"
        )

    def close(self) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Release workers; safe to call twice."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def run_task(
    model: nn.Module,
    client: Client,
    data: TensorData,
    global_params: torch.Tensor,
    task: FitTask,
    worker: str,
    local: LocalTraining | None = None,
    fixed: dict[str, torch.Tensor] | None = None,
) -> TaskResult:
    """Load the global weights into ``model``, train ``client`` with the task's own generator.

    Code that draws from torch's global RNG anyway (dropout, random augmentation) sees it seeded from
    the task seed for the duration of the task, and the caller's RNG state is restored afterwards: the
    result never depends on which tasks ran before on the same worker. The client trains on a private copy
    of the task's state; what that copy holds afterwards comes back as the update's new state.
    An exception inside client code becomes a :class:`ClientFailure` with the full traceback; a client
    that changed its own attributes, or left a state a checkpoint cannot hold, a fatal one. ``fixed``: the
    model's non-float state as built (:func:`~fedsim.core.params.fixed_state`), restored before the task.
    """
    try:
        if fixed:
            restore_fixed_state(model, fixed)
        load_flat(model, global_params)
        generator = torch.Generator().manual_seed(task.seed)
        state = copy_state(task.state)
        update, changed = _fit_guarded(model, client, data, task, generator, local, state)
        if changed is not None:
            return _failure(task, worker, client_guard.mutation_message(client, changed), fatal=True)
        new_state = update.state if update.state is not None else state
        if local is not None:
            local.update_state(new_state, task.config, global_params, update)
        problem = state_problem(new_state, f"client {task.client_id}'s state")
        if problem is not None:
            return _failure(task, worker, problem, fatal=True)
        return replace(update, worker=worker, state=copy_state(new_state))
    except Exception as error:  # noqa: BLE001 - client code may raise anything; it becomes data
        return _failure(task, worker, f"{type(error).__name__}: {error}", traceback=tb.format_exc())


def _fit_guarded(
    model: nn.Module,
    client: Client,
    data: TensorData,
    task: FitTask,
    generator: torch.Generator,
    local: LocalTraining | None,
    state: dict,
) -> tuple[ClientUpdate, str | None]:
    """``client.fit`` under the task's seeded global RNG, and the attribute it changed on ``self`` (if any);
    the client's declared ``task_attributes`` are put back whatever happens."""
    before = client_guard.snapshot(client)
    try:
        with _task_global_rng(task.seed, next(model.parameters()).device):
            update = client.fit(
                model, data, config=task.config, generator=generator, round_num=task.round_num, local=local, state=state
            )
        return update, client_guard.changed_attribute(client, before)
    finally:
        client_guard.restore_task_attributes(client, before)


def _failure(task: FitTask, worker: str, error: str, *, traceback: str = "", fatal: bool = False) -> ClientFailure:
    return ClientFailure(
        client_id=task.client_id,
        round_num=task.round_num,
        error=error,
        traceback=traceback or error,
        worker=worker,
        fatal=fatal,
    )


def retry_or_fail(
    task: FitTask | EvalTask,
    reason: str,
    worker: str,
    max_retries: int,
    attempts: dict[int, int],
    pending: deque[FitTask | EvalTask],
    results: dict[int, TaskResult | EvalResult],
) -> None:
    """After a worker died or timed out on ``task``: queue it again (same seed) while retries remain,
    else record a :class:`ClientFailure` saying why. Shared by the process and Ray executors."""
    attempts[task.client_id] = attempts.get(task.client_id, 0) + 1
    if attempts[task.client_id] <= max_retries:
        pending.appendleft(task)
        return
    results[task.client_id] = ClientFailure(
        client_id=task.client_id,
        round_num=task.round_num,
        error=reason,
        traceback=f"{reason} ({attempts[task.client_id]} attempts, max_retries={max_retries})",
        worker=worker,
        attempts=attempts[task.client_id],
    )


@contextmanager
def _task_global_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch's global RNG (CPU, and the task's GPU) from the task seed; restore it on exit.

    Not ``torch.manual_seed``: on a machine without an initialised GPU it queues a lazy seed for every
    accelerator type, formatting a stack trace each time (67 µs per task here, against 1 µs)."""
    gpus = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=gpus, device_type="cuda"):
        torch.default_generator.manual_seed(seed)
        if device.type == "cuda":
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        yield


def warm_up(model: torch.nn.Module, data: TensorData) -> None:
    """Pay one-time costs (lazy imports behind the first optimizer, first backward) before the first task, so that
    they do not land in the first round (a worker, before it reports ready; ``executor=auto``, before it times the
    first round). Weights are overwritten by every task anyway; the caller's RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        logits = model(data.x[:2])  # [2, classes], or [2, T, vocab] with token labels [2, T]: one row per label
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, -2), data.y[:2].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
