"""Server: the run loop. Each round is the list of stages :mod:`fedsim.server.compose` put together (plan → dispatch →
upload → receive → aggregate → commit → measure → evaluate, with the capabilities' and your own stages at their
positions); the server runs it, logs the round and checkpoints."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedsim.core.errors import ClientMisuseError, RoundFailedError, StrategyError  # noqa: F401 (re-exported)
from fedsim.core.params import flatten, load_flat
from fedsim.core.run_lock import hold
from fedsim.core.threads import torch_threads
from fedsim.executor.base import Executor, Workload
from fedsim.observe.run_logger import RunLogger, process_rss_mb
from fedsim.server.central_eval import evaluate_global
from fedsim.server.checkpointing import RunCheckpoints
from fedsim.server.compose import compose_round
from fedsim.server.early_stop import EarlyStop
from fedsim.server.federated_eval import evaluate_clients
from fedsim.server.record import RoundRecord
from fedsim.server.settings import Checkpoints, Evaluation, Federation, Schedule, Stages, refuse_moved
from fedsim.server.setup import (
    build_parts,
    check_local_training,
    check_model_fits_data,
    check_run,
    initial_model,
    run_context,
)
from fedsim.server.stage import run_stages
from fedsim.strategy.base import Strategy
from fedsim.strategy.context import RunContext

log = logging.getLogger("fedsim")
__all__ = ["ClientMisuseError", "RoundFailedError", "RunResult", "Server", "StrategyError"]


@dataclass
class RunResult:
    """The final global weights (flat), the model holding them and one metrics record per round."""

    params: torch.Tensor
    model: nn.Module
    history: list[dict[str, Any]] = field(default_factory=list)
    stopped_early: bool = False
    stop_reason: str = "completed"


class Server:
    """Runs ``schedule.num_rounds`` rounds of federated training.

    ``model_factory()`` builds a fresh model (seeded from ``seed``); ``federation``: the clients and their data;
    ``schedule``: rounds, clients per round, the failure a round tolerates, early stopping; ``evaluation``: when and
    where the test set and the clients' local splits are scored; ``checkpoints``: where and how often the run is
    saved (``None``: never); ``stages``: the round's optional stages and your own (``Stages(extra=[...])``);
    ``logger``: where metrics go (``None``: memory only). Every setting is checked here, before any work, in one line.
    The run's parts are :attr:`parts`, its round :attr:`stages`, its checkpoints :attr:`checkpoints`."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Server:
        """Refuse, in one line naming where each went, the keyword arguments of the ungrouped constructor."""
        refuse_moved(kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        *,
        model_factory: Callable[[], nn.Module],
        federation: Federation,
        strategy: Strategy,
        executor: Executor,
        schedule: Schedule,
        seed: int = 0,
        logger: RunLogger | None = None,
        evaluation: Evaluation | None = None,
        checkpoints: Checkpoints | None = None,
        stages: Stages | None = None,
    ) -> None:
        evaluation, stages = evaluation or Evaluation(), stages or Stages()
        schedule = replace(schedule, early_stop=schedule.early_stop or EarlyStop())
        checked = check_run(federation, strategy, schedule, evaluation, stages, seed)
        executor.prepare(model_factory, logger.run_dir if logger is not None else None)  # workers build meanwhile
        with closed_on_error(executor):
            self.model_factory, self.model = model_factory, initial_model(model_factory, seed)
            check_model_fits_data(self.model, federation.train_data)
            self.params = flatten(self.model)
            directory = Path(checkpoints.dir) if checkpoints is not None else None
            self._dir_lease = hold(directory) if directory is not None else None  # the directory is this run's
            self.parts = build_parts(
                self.model,
                self.params,
                federation,
                strategy,
                executor,
                (schedule, evaluation, stages),
                logger=logger or RunLogger(None),
                checkpoint_dir=directory,
                seed=seed,
                checked=checked,
            )
            self.stages = compose_round(self.parts, checked[1], stages.extra)
            self.checkpoints = RunCheckpoints(checkpoints, self.parts, self.stages)
            self.start_round, self.stopped_early, self.stop_reason, self._stop_requested = 1, False, "completed", False
            self._stage_stop: str | None = None  # why the last round's stages asked the run to stop (RoundRecord)
            strategy.setup(self.run_context())  # here, so that a strategy's objection comes before any work
            workload = self.workload()
            check_local_training(workload.local, self.model, self.parts.clients)  # e.g. MOON's representation
            executor.check(workload)  # likewise the executor's (e.g. what vmap cannot vectorise)

    logger = property(lambda self: self.parts.logger, doc="The run's :class:`~fedsim.observe.run_logger.RunLogger`.")
    strategy = property(lambda self: self.parts.strategy, doc="The run's strategy.")
    clients = property(lambda self: self.parts.clients, doc="The clients as the run trains them.")
    num_rounds = property(lambda self: self.parts.schedule.num_rounds, doc="How many rounds the run has in all.")
    settings = property(
        lambda self: self.checkpoints.settings,
        lambda self, value: setattr(self.checkpoints, "settings", value),
        doc="The run's settings as dotted keys (fedsim.cli.run sets them): what a resume may not change silently.",
    )

    @property
    def finished(self) -> bool:
        """Whether every round is done already (a resume from the last round's checkpoint)."""
        return self.start_round > self.num_rounds

    @property
    def stop_requested(self) -> bool:
        """Whether :meth:`request_stop` was called: the run ends after the current round, with a checkpoint."""
        return self._stop_requested

    def request_stop(self) -> None:
        """Finish the current round, write a checkpoint and return from :meth:`run` (safe from a signal handler)."""
        self._stop_requested = True

    def run(self) -> RunResult:
        """Run the remaining rounds and return the final model; workers and the run's directories are released even
        on error. A checkpoint is written every ``checkpoints.every`` rounds, at the end and on a requested stop;
        when round k raises, round k-1's is written (unless on disk) from the state it ended with, and the error
        propagates."""
        try:
            if self.finished:  # a resume of a run that had already done all its rounds
                self.parts.executor.close()  # what prepare() started
                self.parts.logger.close()
                return self._result("already finished")
            with torch_threads(self.parts.schedule.threads):
                return self._rounds()
        finally:
            if self._dir_lease is not None:
                self._dir_lease.release()

    def _rounds(self) -> RunResult:
        if self.start_round == 1:
            self.parts.client_states.clear()  # a fresh run: whatever an earlier run left in this directory goes
        workload = self.workload()
        self.parts.local = workload.local  # the strategy's client half for this run (what personalise() comes from)
        self.parts.executor.start(workload)
        last_good = self.checkpoints.snapshot(self.start_round - 1, self.params)  # what an error falls back to
        try:
            for round_num in self.parts.logger.rounds(self.start_round, self.num_rounds):
                self.parts.logger.log_round(round_num, self.run_round(round_num))
                stop = self._stops_after(round_num)
                if self.checkpoints.due(round_num, self.num_rounds, self.stop_reason != "completed"):
                    self.save_checkpoint(round_num)
                    last_good = None
                else:
                    last_good = self.checkpoints.snapshot(round_num, self.params)
                if stop:
                    break
        except Exception:  # a second Ctrl-C (KeyboardInterrupt) only stops; run.py reports it
            self.checkpoints.save_last_good(last_good)
            raise
        finally:
            self.parts.executor.close()
            self.parts.logger.close()
        return self._result(self.stop_reason)

    def _result(self, reason: str) -> RunResult:
        load_flat(self.model, self.params)
        return RunResult(self.params, self.model, self.parts.logger.history, self.stopped_early, reason)

    def _stops_after(self, round_num: int) -> bool:
        """Whether the run ends after ``round_num``: a signal, early stopping, or a stage's stop (e.g. DP's budget)."""
        if round_num == self.num_rounds:
            return False
        if self._stop_requested:
            self.stopped_early, self.stop_reason = True, f"interrupted after round {round_num}"
            return True
        early_stop = self.parts.schedule.early_stop
        assert early_stop is not None  # __init__ gives the schedule one
        early = early_stop.check(self.parts.logger.history[-1])
        reason = f"early stop: {early}" if early is not None else self._stage_stop
        if reason is not None:
            self.stop_reason = reason
            log.info("%s", reason)
        return reason is not None

    def run_round(self, round_num: int) -> dict[str, float]:
        """One round (:attr:`stages`) from the current weights: its client rows are logged, its metrics returned. The
        weights move on to those the round got to, also when a later stage fails. The server's work runs on
        ``schedule.threads`` here too, not only under :meth:`run`, for a caller that drives the rounds itself."""
        record = RoundRecord(round_num, self.params, time.perf_counter(), self.params)
        try:
            with torch_threads(self.parts.schedule.threads):
                run_stages(self.stages, record)
        finally:
            self.params = record.params
        record.metrics["time/round_s"] = time.perf_counter() - record.start_s
        record.metrics["system/rss_mb"] = process_rss_mb()
        self.parts.logger.log_clients(round_num, record.rows)
        self._stage_stop = record.stop_reason
        return record.metrics

    def workload(self) -> Workload:
        """What every worker builds once per run: the model, the clients, their data and the strategy's client half."""
        parts = self.parts
        local = parts.strategy.local_training()
        return Workload(self.model_factory, parts.clients, parts.train_data, log_dir=parts.logger.run_dir, local=local)

    def run_context(self) -> RunContext:
        """What the strategy is told about the run (:meth:`Strategy.setup`)."""
        return run_context(self.parts, self.model, self.start_round)

    def save_checkpoint(self, round_num: int) -> Path:
        """Write the checkpoint of ``round_num`` from the current state."""
        return self.checkpoints.save(self.checkpoints.state_dict(round_num, self.params))

    def resume(self, target: str | Path, allow_changes: Sequence[str] = ()) -> Path:
        """Continue from a checkpoint file, a checkpoints directory or a run directory (newest good checkpoint).
        Settings that change the computation must be the checkpoint's, except those in ``allow_changes``
        (:mod:`fedsim.server.resume_check`)."""

        def set_up(start_round: int) -> None:
            self.start_round = start_round
            self.parts.strategy.setup(self.run_context())

        path, self.params, self.start_round = self.checkpoints.resume(target, self.params, allow_changes, set_up)
        if self.finished:
            log.info("%s is of round %d: the run is finished, nothing to do", path, self.start_round - 1)
        else:
            log.info("resumed from %s: continuing at round %d", path, self.start_round)
        return path

    def evaluate(self) -> dict[str, float]:
        """Loss and accuracy of the current global model on the centralized test set."""
        return evaluate_global(self.parts.evaluator, self.parts.test_data, self.params)

    def evaluate_clients(self, round_num: int, sampled: Sequence[int]) -> dict[str, float]:
        """Federated evaluation of the clients ``evaluate_clients`` names (``sampled``: this round's)."""
        return evaluate_clients(self.parts, self.params, round_num, sampled)


@contextlib.contextmanager
def closed_on_error(executor: Executor) -> Iterator[None]:
    """Close ``executor`` (the workers :meth:`Executor.prepare` started) if the block raises, then re-raise."""
    try:
        yield
    except BaseException:
        executor.close()
        raise
