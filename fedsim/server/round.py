"""One round as a sequence of stages.

A synchronous round runs ``Plan → Dispatch → Receive → Aggregate → CommitStates → Measure → AdvanceClock →
Evaluate``; a server step of an asynchronous strategy (FedBuff) runs ``BufferedStep → CommitStates → MeasureStep →
Evaluate``. Each stage is a small object holding the parts it works with (the capability it stands for: the clock,
the exchange with its codecs, central DP, the attack, stragglers) and one method, :meth:`RoundStage.run`, which reads
and extends the round's :class:`RoundRecord`. The :class:`~fedsim.server.Server` builds the sequence from its parts
at the start of every round (references only, so a part replaced on the server is the one used) and returns the
record's metrics. A new capability is a new stage in the sequence (docs/architecture.md shows one), not a branch
in the server.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedsim.attacks.stage import AttackStage
from fedsim.client.base import Client
from fedsim.client.state import ClientStateStore
from fedsim.core.checkpoint import list_checkpoints
from fedsim.core.seeding import sampling_rng, task_seed
from fedsim.core.types import ClientUpdate, FitTask, TaskResult
from fedsim.executor.base import Executor
from fedsim.observe.run_logger import RunLogger, process_rss_mb
from fedsim.privacy.rounds import PrivateRounds
from fedsim.server.buffered import BufferedLoop, consumed_ids
from fedsim.server.exchange import Exchange, task_state
from fedsim.server.metrics import async_row_extras, attack_metrics, row_extras, wire_metrics
from fedsim.server.parts import RoundParts, Stateful
from fedsim.server.round_metrics import client_row, train_metrics, with_strategy_values
from fedsim.server.stragglers import Stragglers
from fedsim.server.strategy_guard import checked_aggregate, checked_client_values, checked_scalars
from fedsim.server.updates import apply_failure_policy, sound_updates
from fedsim.sim.clock import RoundSchedule, SyncClock
from fedsim.sim.rounds import clocked_round
from fedsim.strategy.base import Strategy


@dataclass
class RoundRecord:
    """What a round has produced so far; each stage reads what earlier stages wrote and adds its own part.

    ``params`` holds the global weights: those the round started from (``start_params``) until :class:`Aggregate`
    replaces them. ``results``: every task's result as received; ``updates``: the successful ones that passed the
    checks; ``kept``: those that reach aggregation (dropped stragglers removed)."""

    round_num: int
    start_params: torch.Tensor
    start_s: float
    params: torch.Tensor
    configs: dict[int, dict[str, Any]] = field(default_factory=dict)
    schedule: RoundSchedule | None = None
    results: Sequence[TaskResult] = field(default_factory=list)
    succeeded: list[ClientUpdate] = field(default_factory=list)
    updates: list[ClientUpdate] = field(default_factory=list)
    kept: list[ClientUpdate] = field(default_factory=list)
    from_strategy: dict[str, float] = field(default_factory=dict)
    client_values: dict[int, dict[str, Any]] | None = None
    consumed: list[tuple[ClientUpdate, torch.Tensor]] = field(default_factory=list)
    evaluated_ids: list[int] = field(default_factory=list)
    fit_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def client_ids(self) -> list[int]:
        """The round's tasks' clients, sorted."""
        return sorted(self.configs)


class RoundStage:
    """One step of a round: :meth:`run` reads and extends the round's record; :meth:`checkpoint_parts` names the
    stateful parts the stage owns, each with its entry in the checkpoint (none by default)."""

    def run(self, record: RoundRecord) -> None:
        raise NotImplementedError

    def checkpoint_parts(self) -> dict[str, Stateful]:
        return {}


@dataclass(frozen=True)
class Plan(RoundStage):
    """Who trains and with which config: the strategy's sample (Poisson sampling under central DP), the config of
    each task (a straggler's fewer epochs), which entries the clients upload (all but the strategy's personal
    entries), and with a simulated clock the round's schedule (who finishes by the deadline, who drops out)."""

    strategy: Strategy
    clients: Sequence[Client]
    clients_per_round: int
    seed: int
    client_config: Callable[[int, int], dict[str, Any]]
    comm: Exchange
    clock: SyncClock | None
    privacy: PrivateRounds | None

    def checkpoint_parts(self) -> dict[str, Stateful]:
        return {"clock": self.clock} if self.clock is not None else {}

    def run(self, record: RoundRecord) -> None:
        round_num, rng = record.round_num, sampling_rng(self.seed, record.round_num)
        self.comm.keep_on_clients(self.strategy.personal_entries())  # what is uploaded: the bytes the clock sends
        if self.clock is None:
            ids = (
                self.privacy.sample(rng, len(self.clients))
                if self.privacy is not None
                else self.strategy.sample(round_num, len(self.clients), self.clients_per_round, rng)
            )
            record.configs = {cid: self.client_config(round_num, cid) for cid in ids}
            return
        record.schedule, record.configs = clocked_round(
            self.clock,
            self.strategy,
            round_num,
            rng,
            clients=self.clients,
            clients_per_round=self.clients_per_round,
            config_of=lambda cid: self.client_config(round_num, cid),
            model_bytes=self.comm.down_bytes,
            update_bytes=self.comm.up_bytes,
        )


@dataclass(frozen=True)
class Dispatch(RoundStage):
    """The round's tasks (each with its client's state and seed) through the exchange: the global weights encoded
    down, the executor's training, the attack's replacements, the updates decoded up."""

    executor: Executor
    comm: Exchange
    client_states: ClientStateStore
    attack: AttackStage | None
    seed: int

    def checkpoint_parts(self) -> dict[str, Stateful]:
        return {"comm": self.comm}

    def run(self, record: RoundRecord) -> None:
        round_num = record.round_num
        states = {cid: self.client_states.get(cid) for cid in record.client_ids}
        tasks = [
            FitTask(cid, round_num, task_seed(self.seed, round_num, cid), record.configs[cid], task_state(states[cid]))
            for cid in record.client_ids
        ]
        apply = self.attack.apply if self.attack else None
        record.results = self.comm.fit(self.executor, record.params, tasks, states, apply)
        record.fit_s = time.perf_counter() - record.start_s


@dataclass(frozen=True)
class Receive(RoundStage):
    """What may reach aggregation: the failure policy, every update checked against the global weights, and
    simulated stragglers' updates dropped unless the strategy keeps them."""

    logger: RunLogger
    min_success_fraction: float
    strategy: Strategy
    stragglers: Stragglers

    def run(self, record: RoundRecord) -> None:
        round_num = record.round_num
        record.succeeded = apply_failure_policy(round_num, record.results, self.min_success_fraction, self.logger)
        record.updates = sound_updates(round_num, record.succeeded, record.params, self.logger)
        record.kept = [
            u
            for u in record.updates
            if self.strategy.keeps_stragglers or self.stragglers.epochs_for(round_num, u.client_id) is None
        ]


@dataclass(frozen=True)
class Aggregate(RoundStage):
    """The next global weights: the strategy's aggregate of the kept updates (under central DP, of the one noisy mean
    update), with the strategy's own scalars and per-client values; the weights stay when nothing arrived."""

    strategy: Strategy
    logger: RunLogger
    privacy: PrivateRounds | None

    def checkpoint_parts(self) -> dict[str, Stateful]:
        return {"privacy": self.privacy} if self.privacy is not None else {}

    def run(self, record: RoundRecord) -> None:
        round_num, aggregated = record.round_num, record.kept
        if self.privacy is not None:  # one noisy mean update, even from an empty cohort
            aggregated, record.from_strategy = self.privacy.aggregate_input(round_num, record.params, record.kept)
        if aggregated:  # otherwise nothing sound (or only dropped stragglers) arrived: keep the previous model
            record.params = checked_aggregate(self.strategy, round_num, record.params, aggregated, self.logger)
            record.from_strategy |= checked_scalars(self.strategy, round_num)
            record.client_values = checked_client_values(self.strategy, round_num, aggregated)


@dataclass(frozen=True)
class CommitStates(RoundStage):
    """The accepted updates' new client states become the clients' states; versions that no kept checkpoint needs
    any more are collected."""

    client_states: ClientStateStore
    checkpoint_dir: Path | None

    def run(self, record: RoundRecord) -> None:
        kept = record.kept
        self.client_states.commit(record.round_num, {u.client_id: u.state for u in kept if u.state is not None})
        kept_rounds = (
            [int(p.stem.split("-")[1]) for p in list_checkpoints(self.checkpoint_dir)] if self.checkpoint_dir else []
        )
        self.client_states.collect(kept_rounds)


@dataclass(frozen=True)
class Measure(RoundStage):
    """The round's client rows (logged) and metrics: training, the strategy's, bytes and DP-SGD's spent privacy, the
    attack's counts, and the clock's schedule."""

    parts: RoundParts

    def checkpoint_parts(self) -> dict[str, Stateful]:
        return {"local_dp": self.parts.local_dp} if self.parts.local_dp is not None else {}

    def run(self, record: RoundRecord) -> None:
        round_num, parts = record.round_num, self.parts
        rows = [
            client_row(u, record.start_params) | row_extras(parts, round_num, u.client_id, record.configs[u.client_id])
            for u in record.updates
        ]
        if record.client_values is not None:
            rows = with_strategy_values(rows, record.client_values)
        parts.logger.log_clients(round_num, rows)
        schedule = record.schedule
        down = (
            schedule.download_bytes
            if schedule is not None  # the clock's dropped clients downloaded too
            else sum(parts.comm.task_down_bytes(record.configs[cid]) for cid in record.client_ids)
        )
        metrics = (
            train_metrics(record.updates, len(record.results))
            | record.from_strategy
            | wire_metrics(parts, down, record.results)
        )
        metrics |= attack_metrics(parts, round_num, record.client_ids, record.kept)
        metrics["client/num_rejected"] = float(len(record.succeeded) - len(record.updates))
        metrics["client/num_aggregated"] = float(len(record.kept))
        if schedule is not None:
            metrics.update(schedule.metrics())
        record.metrics = metrics
        record.evaluated_ids = record.client_ids


@dataclass(frozen=True)
class AdvanceClock(RoundStage):
    """The simulated clock moves on by the round's duration."""

    clock: SyncClock

    def run(self, record: RoundRecord) -> None:
        assert record.schedule is not None  # Plan made one: the run has a clock
        self.clock.advance(record.schedule)


@dataclass(frozen=True)
class BufferedStep(RoundStage):
    """One server step of an asynchronous strategy (FedBuff): events on the clock until its buffer is full, then
    the strategy's step (:class:`fedsim.server.buffered.BufferedLoop`)."""

    loop: BufferedLoop
    parts: RoundParts

    def checkpoint_parts(self) -> dict[str, Stateful]:
        return {"clock": self.loop.clock, "async": self.loop, "comm": self.parts.comm}

    def run(self, record: RoundRecord) -> None:
        step = self.loop.step(self.parts, record.params, record.round_num)
        record.fit_s, record.params = time.perf_counter() - record.start_s, step.params
        record.consumed, record.results = step.consumed, step.arrived
        record.kept = record.updates = [u for u, _ in step.consumed]
        record.client_values, record.metrics = step.client_values, step.metrics


@dataclass(frozen=True)
class MeasureStep(RoundStage):
    """An asynchronous server step's client rows (each against the weights its client started from) and metrics."""

    parts: RoundParts

    def checkpoint_parts(self) -> dict[str, Stateful]:
        return {"local_dp": self.parts.local_dp} if self.parts.local_dp is not None else {}

    def run(self, record: RoundRecord) -> None:
        round_num, parts = record.round_num, self.parts
        rows = [
            client_row(u, started) | async_row_extras(parts, round_num, u.client_id) for u, started in record.consumed
        ]
        parts.logger.log_clients(round_num, with_strategy_values(rows, record.client_values or {}))
        down = int(record.metrics["sim/started"]) * parts.comm.down_bytes
        record.metrics = (
            train_metrics(record.updates, len(record.results))
            | record.metrics
            | wire_metrics(parts, down, record.results)
        )
        record.metrics["client/num_aggregated"] = float(len(record.updates))
        record.evaluated_ids = consumed_ids(record.updates)


@dataclass(frozen=True)
class Evaluate(RoundStage):
    """Central evaluation (``eval/``, and an attack's backdoor success) and every-client evaluation when due, then the
    round's wall times and memory."""

    central: Callable[[torch.Tensor], dict[str, float]]
    clients: Callable[[torch.Tensor, int, Sequence[int]], dict[str, float]]
    central_due: bool
    clients_due: bool

    def run(self, record: RoundRecord) -> None:
        eval_start, metrics = time.perf_counter(), record.metrics
        if self.central_due:
            metrics.update(self.central(record.params))
        if self.clients_due:
            metrics.update(self.clients(record.params, record.round_num, record.evaluated_ids))
        if self.central_due or self.clients_due:
            metrics["time/eval_s"] = time.perf_counter() - eval_start
        metrics["time/fit_s"] = record.fit_s
        metrics["time/round_s"] = time.perf_counter() - record.start_s
        metrics["system/rss_mb"] = process_rss_mb()


def checkpoint_parts(stages: Sequence[RoundStage]) -> dict[str, Stateful]:
    """Every stateful part the ``stages`` own, by its checkpoint entry."""
    return {key: part for stage in stages for key, part in stage.checkpoint_parts().items()}


def run_stages(stages: Sequence[RoundStage], record: RoundRecord) -> RoundRecord:
    """Run ``stages`` in order on ``record``; returns it."""
    for stage in stages:
        stage.run(record)
    return record
