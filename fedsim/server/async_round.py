"""The ``aggregate`` stage of an asynchronous strategy's server step (FedBuff): events on the simulated clock until the
strategy's buffer is full, then its step (:class:`fedsim.server.buffered.BufferedLoop`). Its ``measure`` is
:class:`fedsim.server.measure.MeasureStep`; ``commit`` and ``evaluate`` are the synchronous round's."""

from __future__ import annotations

import time

from fedsim.server.buffered import BufferedLoop
from fedsim.server.parts import RoundParts
from fedsim.server.record import RoundRecord
from fedsim.server.stage import RoundStage, Stateful


class BufferedStep(RoundStage):
    """One server step of an asynchronous strategy: the loop's events and the strategy's step, each arrival's bytes
    (its upload; its download belongs to the step that started it) and whether its client is malicious, and the
    step's ``comm/`` bytes."""

    name = "aggregate"

    def __init__(self, loop: BufferedLoop, parts: RoundParts) -> None:
        self.loop, self.parts = loop, parts
        self.needs = frozenset(parts.strategy.needs)

    def checkpoint_parts(self) -> dict[str, Stateful]:
        return {"clock": self.loop.clock, "async": self.loop, "comm": self.parts.comm}

    def run(self, record: RoundRecord) -> None:
        parts = self.parts
        step = self.loop.step(parts, record.params, record.round_num)
        record.fit_s, record.params = time.perf_counter() - record.start_s, step.params
        record.consumed, record.results = step.consumed, step.arrived
        record.kept = record.updates = [u for u, _ in step.consumed]
        record.client_values, record.metrics = step.client_values, step.metrics
        for u in record.updates:
            record.add_to_rows(u.client_id, bytes_up=parts.comm.up_bytes)
            if parts.attack is not None:
                record.add_to_rows(u.client_id, malicious=u.client_id in parts.attack.malicious(record.round_num))
        down = int(record.metrics["sim/started"]) * parts.comm.down_bytes
        record.metrics |= parts.comm.round_metrics(down, record.results)
