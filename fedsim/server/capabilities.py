"""The optional capabilities of a round as stages, each with the position a researcher's stage would give it
(:mod:`fedsim.server.stage`): simulated stragglers, the simulated clock, central DP, DP-SGD clients' ledger, and an
attack. :func:`capability_stages` lists those a run uses; :mod:`fedsim.server.compose` places them."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedsim.client.scoring import evaluate_indices
from fedsim.core.types import ClientUpdate
from fedsim.server.parts import RoundParts
from fedsim.server.record import RoundRecord
from fedsim.server.round import Plan
from fedsim.server.stage import CLOCK, UPDATES, RoundStage, Stateful
from fedsim.sim.rounds import clocked_round


class DropStragglers(RoundStage):
    """Simulated stragglers' updates (``stragglers.fraction``: fewer local epochs or steps) do not reach aggregation
    unless the strategy keeps them (:attr:`fedsim.strategy.Strategy.keeps_stragglers`)."""

    name, position, needs = "stragglers", "after receive", frozenset({UPDATES})

    def __init__(self, parts: RoundParts) -> None:
        self.parts = parts

    def run(self, record: RoundRecord) -> None:
        if self.parts.strategy.keeps_stragglers:
            return
        record.kept = [u for u in record.kept if not self.parts.straggles(record.round_num, u.client_id)]


class ClockedPlan(Plan):
    """The round on the simulated clock: the strategy picks among the clients online when the round starts, and the
    clock's schedule says who finishes by the deadline, who is cut short and who drops out
    (:func:`fedsim.sim.rounds.clocked_round`)."""

    position, needs, label = "instead of plan", frozenset({CLOCK}), "the simulated clock's plan"

    def checkpoint_parts(self) -> dict[str, Stateful]:
        assert self.parts.clock is not None
        return {"clock": self.parts.clock}

    def run(self, record: RoundRecord) -> None:
        parts, round_num = self.parts, record.round_num
        assert parts.clock is not None
        parts.comm.keep_on_clients(parts.strategy.personal_entries())  # what is uploaded: the bytes the clock sends
        record.schedule, record.configs = clocked_round(
            parts.clock,
            parts.strategy,
            round_num,
            self.rng(round_num),
            clients=parts.clients,
            clients_per_round=parts.schedule.clients_per_round,
            config_of=lambda cid: parts.client_config(round_num, cid),
            model_bytes=parts.comm.down_bytes,
            update_bytes=parts.comm.up_bytes,
        )


class AdvanceClock(RoundStage):
    """The round's ``sim/`` metrics (its simulated duration, who dropped out...), then the clock moves on by it."""

    name, position, needs = "clock", "after measure", frozenset({CLOCK})

    def __init__(self, parts: RoundParts) -> None:
        self.parts = parts

    def run(self, record: RoundRecord) -> None:
        assert record.schedule is not None and self.parts.clock is not None  # the clock's plan made one
        record.metrics.update(record.schedule.metrics())
        self.parts.clock.advance(record.schedule)


class PrivatePlan(Plan):
    """Central DP's sample: every client independently with probability ``clients_per_round / N`` (Poisson
    sampling, what the accountant assumes)."""

    position, label = "instead of plan", "dp's Poisson sampling"

    def sample(self, round_num: int, rng: np.random.Generator) -> list[int]:
        assert self.parts.privacy is not None
        return self.parts.privacy.sample(rng, len(self.parts.clients))


class NoisyMean(RoundStage):
    """Central DP (DP-FedAvg): the strategy aggregates one noisy mean update instead of the individual ones (even from
    an empty cohort), the ``dp/`` metrics, and the run stops before a round that would exceed ``dp.epsilon_max``."""

    name, position, needs = "dp", "before aggregate", frozenset({UPDATES})
    preserves, label = frozenset({CLOCK}), "dp=central's noisy mean"

    def __init__(self, parts: RoundParts) -> None:
        self.parts = parts

    def checkpoint_parts(self) -> dict[str, Stateful]:
        assert self.parts.privacy is not None
        return {"privacy": self.parts.privacy}

    def run(self, record: RoundRecord) -> None:
        privacy = self.parts.privacy
        assert privacy is not None
        record.aggregate_input, metrics = privacy.aggregate_input(record.round_num, record.params, record.kept)
        record.metrics.update(metrics)
        record.stop_reason = record.stop_reason or privacy.stop_reason(record.round_num + 1)


class LocalDPReport(RoundStage):
    """DP-SGD clients' privacy spent: every update that came back was released, accepted or not (``dp/``)."""

    name, position, needs = "local_dp", "after measure", frozenset()

    def __init__(self, parts: RoundParts) -> None:
        self.parts = parts

    def checkpoint_parts(self) -> dict[str, Stateful]:
        assert self.parts.local_dp is not None
        return {"local_dp": self.parts.local_dp}

    def run(self, record: RoundRecord) -> None:
        assert self.parts.local_dp is not None
        record.metrics.update(self.parts.local_dp.record([r for r in record.results if isinstance(r, ClientUpdate)]))


class PoisonUpdates(RoundStage):
    """The malicious clients' updates replaced before they are encoded, as a client would (:mod:`fedsim.attacks`);
    each client row says whether its client is malicious."""

    name, position, needs = "attack", "after dispatch", frozenset()

    def __init__(self, parts: RoundParts) -> None:
        self.parts = parts

    def run(self, record: RoundRecord) -> None:
        attack = self.parts.attack
        assert attack is not None
        if record.received is not None:
            record.results = attack.apply(record.results, record.received)
        bad = attack.malicious(record.round_num)
        for cid in record.client_ids:
            record.add_to_rows(cid, malicious=cid in bad)


class AttackReport(RoundStage):
    """The round's ``attack/`` counts: malicious clients sampled, aggregated and, for a rule that selects updates
    (Krum), selected."""

    name, position, needs = "attack_report", "after measure", frozenset()

    def __init__(self, parts: RoundParts) -> None:
        self.parts = parts

    def run(self, record: RoundRecord) -> None:
        parts = self.parts
        assert parts.attack is not None
        selected = getattr(parts.strategy, "selected_client_ids", None)
        record.metrics.update(parts.attack.round_metrics(record.round_num, record.client_ids, record.kept, selected))


class BackdoorEval(RoundStage):
    """A backdoor's success (``attack/backdoor_success``: the global model's accuracy on the triggered test set),
    whenever the global model was evaluated."""

    name, position, needs = "backdoor", "after evaluate", frozenset()

    def __init__(self, parts: RoundParts) -> None:
        self.parts = parts

    def run(self, record: RoundRecord) -> None:
        parts = self.parts
        if not record.central_evaluated or parts.attack is None:
            return
        model = parts.evaluator.load(record.params)
        record.metrics.update(
            parts.attack.evaluate(lambda d: evaluate_indices(model, parts.evaluator.on_device(d))["accuracy"])
        )


def capability_stages(parts: RoundParts, asynchronous: bool) -> list[RoundStage]:
    """The stages of the optional capabilities ``parts`` has, in the order they are placed. An asynchronous server
    step has its clock, attack and stragglers inside its ``aggregate`` (the event loop of
    :mod:`fedsim.server.buffered`)."""
    stages: list[Any] = []
    if not asynchronous:
        if parts.stragglers.fraction > 0:
            stages.append(DropStragglers(parts))
        if parts.clock is not None:
            stages += [ClockedPlan(parts), AdvanceClock(parts)]
        if parts.privacy is not None:
            stages += [PrivatePlan(parts), NoisyMean(parts)]
        if parts.attack is not None:
            stages += [PoisonUpdates(parts), AttackReport(parts)]
    if parts.local_dp is not None:
        stages.append(LocalDPReport(parts))
    if parts.attack is not None:
        stages.append(BackdoorEval(parts))
    return stages
