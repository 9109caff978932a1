"""The built-in stages of a synchronous round: ``plan → dispatch → upload → receive → aggregate → commit → measure →
evaluate`` (``measure``: :mod:`fedsim.server.measure`; the contract: :mod:`fedsim.server.stage`; a run's round put
together: :mod:`fedsim.server.compose`). Each stage holds the run's parts and reads and extends the round's
:class:`~fedsim.server.record.RoundRecord`. The optional capabilities (stragglers, the clock, central DP, an attack,
DP-SGD) are stages of their own (:mod:`fedsim.server.capabilities`), placed around these by the mechanism a
researcher's stage uses."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from fedsim.client.evaluation import ClientEvaluation
from fedsim.core.checkpoint import list_checkpoints
from fedsim.core.seeding import sampling_rng, task_seed
from fedsim.core.types import FitTask
from fedsim.server.exchange import task_state
from fedsim.server.parts import RoundParts
from fedsim.server.record import RoundRecord
from fedsim.server.stage import RoundStage, Stateful
from fedsim.server.strategy_guard import checked_aggregate, checked_client_values, checked_scalars
from fedsim.server.updates import apply_failure_policy, sound_updates


class Plan(RoundStage):
    """Who trains and with which config: the strategy's sample of the clients, each task's config (a straggler's
    fewer epochs), and which entries the clients upload (all but the strategy's personal entries). Capabilities that
    sample otherwise (central DP, the clock) take its place with a subclass."""

    name, needs = "plan", frozenset()

    def __init__(self, parts: RoundParts) -> None:
        self.parts = parts

    def run(self, record: RoundRecord) -> None:
        parts = self.parts
        parts.comm.keep_on_clients(parts.strategy.personal_entries())  # what is uploaded: the bytes the clock sends
        ids = self.sample(record.round_num, self.rng(record.round_num))
        record.configs = {cid: parts.client_config(record.round_num, cid) for cid in ids}

    def rng(self, round_num: int) -> np.random.Generator:
        """The round's sampling generator: a pure function of (seed, round)."""
        return sampling_rng(self.parts.seed, round_num)

    def sample(self, round_num: int, rng: np.random.Generator) -> list[int]:
        """The round's clients (the strategy's sample)."""
        parts = self.parts
        return parts.strategy.sample(round_num, len(parts.clients), parts.schedule.clients_per_round, rng)


class Dispatch(RoundStage):
    """The round's tasks (each with its client's state and seed): the global weights through the downlink codecs, the
    executor's training, each result as its client would upload it (a strategy's personal entries cut)."""

    name, needs = "dispatch", frozenset()

    def __init__(self, parts: RoundParts) -> None:
        self.parts = parts

    def checkpoint_parts(self) -> dict[str, Stateful]:
        return {"comm": self.parts.comm}

    def run(self, record: RoundRecord) -> None:
        round_num, parts = record.round_num, self.parts
        record.states = {cid: parts.client_states.get(cid) for cid in record.client_ids}
        tasks = [
            FitTask(cid, round_num, task_seed(parts.seed, round_num, cid), record.configs[cid], task_state(state))
            for cid, state in record.states.items()
        ]
        if tasks:
            record.received = parts.comm.broadcast(record.params, round_num)
            results = sorted(parts.executor.fit(record.received, tasks), key=lambda r: r.client_id)
            record.results = [parts.comm.upload(r, record.received) for r in results]
        record.fit_s = time.perf_counter() - record.start_s


class Upload(RoundStage):
    """Each update as the server decodes it (the uplink codecs, error feedback's residual into the client's state),
    each client row's bytes both ways, and the round's ``comm/`` bytes."""

    name, needs = "upload", frozenset()

    def __init__(self, parts: RoundParts) -> None:
        self.parts = parts

    def run(self, record: RoundRecord) -> None:
        comm = self.parts.comm
        if record.received is not None:
            record.results = [
                comm.receive(r, record.received, record.params, record.states.get(r.client_id, {}))
                for r in record.results
            ]
        for cid in record.client_ids:
            record.add_to_rows(cid, bytes_down=comm.task_down_bytes(record.configs[cid]), bytes_up=comm.up_bytes)
        down = (
            record.schedule.download_bytes
            if record.schedule is not None  # the clock's dropped clients downloaded too
            else sum(comm.task_down_bytes(record.configs[cid]) for cid in record.client_ids)
        )
        record.metrics.update(comm.round_metrics(down, record.results))


class Receive(RoundStage):
    """What may reach aggregation: the failure policy, and every update checked against the global weights."""

    name, needs = "receive", frozenset()

    def __init__(self, parts: RoundParts) -> None:
        self.parts = parts

    def run(self, record: RoundRecord) -> None:
        round_num, logger = record.round_num, self.parts.logger
        record.succeeded = apply_failure_policy(round_num, record.results, self.parts.min_success_fraction, logger)
        record.updates = sound_updates(round_num, record.succeeded, record.params, logger)
        record.kept = list(record.updates)


class Aggregate(RoundStage):
    """The next global weights: the strategy's aggregate of the kept updates (or of what a stage put in their place,
    ``aggregate_input``), with the strategy's own scalars and per-client values; the weights stay when nothing
    arrived. It needs what the strategy declares (:attr:`fedsim.strategy.Strategy.needs`)."""

    name = "aggregate"

    def __init__(self, parts: RoundParts) -> None:
        self.parts = parts
        self.needs = frozenset(parts.strategy.needs)
        self.label = f"the strategy {type(parts.strategy).__module__}.{type(parts.strategy).__qualname__}"

    def run(self, record: RoundRecord) -> None:
        strategy, round_num = self.parts.strategy, record.round_num
        aggregated = record.aggregate_input if record.aggregate_input is not None else record.kept
        if aggregated:  # otherwise nothing sound (or only dropped stragglers) arrived: keep the previous model
            record.params = checked_aggregate(strategy, round_num, record.params, aggregated, self.parts.logger)
            record.from_strategy |= checked_scalars(strategy, round_num)
            record.client_values = checked_client_values(strategy, round_num, aggregated)


class CommitStates(RoundStage):
    """The accepted updates' new client states become the clients' states; versions that no kept checkpoint needs
    any more are collected."""

    name, needs = "commit", frozenset()

    def __init__(self, parts: RoundParts) -> None:
        self.parts = parts

    def run(self, record: RoundRecord) -> None:
        store, directory = self.parts.client_states, self.parts.checkpoint_dir
        store.commit(record.round_num, {u.client_id: u.state for u in record.kept if u.state is not None})
        store.collect([int(p.stem.split("-")[1]) for p in list_checkpoints(directory)] if directory else [])


class Evaluate(RoundStage):
    """Central evaluation (``eval/``) every ``every`` rounds and after the last, every-client evaluation when its
    settings say so, and the round's training and evaluation wall times."""

    name, needs = "evaluate", frozenset()

    def __init__(
        self,
        central: Callable[[torch.Tensor], dict[str, float]],
        clients: Callable[[torch.Tensor, int, Sequence[int]], dict[str, float]],
        *,
        every: int,
        num_rounds: int,
        client_eval: ClientEvaluation,
    ) -> None:
        self.central, self.clients = central, clients
        self.every, self.num_rounds, self.client_eval = every, num_rounds, client_eval

    def run(self, record: RoundRecord) -> None:
        eval_start, metrics, round_num = time.perf_counter(), record.metrics, record.round_num
        record.central_evaluated = round_num % self.every == 0 or round_num == self.num_rounds
        clients_due = self.client_eval.due(round_num, self.every, self.num_rounds)
        if record.central_evaluated:
            metrics.update(self.central(record.params))
        if clients_due:
            metrics.update(self.clients(record.params, round_num, record.evaluated_ids))
        if record.central_evaluated or clients_due:
            metrics["time/eval_s"] = time.perf_counter() - eval_start
        metrics["time/fit_s"] = record.fit_s
