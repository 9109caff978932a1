"""The protocol's time (fedsim/secagg/timing.py): a three-client SecAgg round worked by hand from the byte table and the
compute constants, the closed form for large cohorts against the general computation, and the stage on the
simulated clock: the round's schedule carries the protocol's duration, which the clock stage logs and moves by."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsim.core.types import ClientUpdate
from fedsim.secagg import SecureAggregation
from fedsim.secagg.costs import round_bytes
from fedsim.secagg.masking import complete_graph, harary_graph
from fedsim.secagg.protocol import RoundSetup
from fedsim.secagg.timing import (
    ADD_PER_S,
    AGREEMENT_S,
    FIELD_OP_S,
    MASK_PER_S,
    Link,
    phase_seconds,
    round_seconds,
    uniform_round,
)
from fedsim.server import RoundRecord
from fedsim.sim.clock import RoundSchedule, SyncClock, Timing
from fedsim.sim.profiles import DeviceProfiles


def test_a_three_client_round_by_hand() -> None:
    """3 clients, complete graph (k = 2), t = ⌈0.5·3⌉ = 2, d' = 8, b = 16, up 1000 B/s, down 10,000 B/s, ready after
    1, 2 and 3 s. Bytes (docs' table): advertise 64 sent / 2·68 received, share 2·60 each way, masked 16 / 2·4,
    unmask 3·20 / 0."""
    setup = RoundSetup(0, 1, 16, complete_graph([0, 1, 2]), 0.5)
    links = {c: Link(1000.0, 10000.0, ready_s=1.0 + c) for c in range(3)}
    phases = phase_seconds(setup, [0, 1, 2], round_bytes(setup.neighbours, [0, 1, 2], 8, 16), 8, links)
    advertise = 2 * AGREEMENT_S + 64 / 1000 + 136 / 10000
    share = 2 * AGREEMENT_S + 2 * 3 * 2 * FIELD_OP_S + 120 / 1000 + 120 / 10000
    masked = 3.0 + 2 * AGREEMENT_S + 3 * 8 / MASK_PER_S + 16 / 1000 + 8 / 10000  # the last client, ready at 3 s
    server = 3 * 8 / ADD_PER_S + (2 * 2 + 3 * 2) * FIELD_OP_S + 3 * 8 / MASK_PER_S  # one holder set; 3 self-masks
    unmask = 60 / 1000 + (2 * 2 + 3 * 2) * FIELD_OP_S + 3 * 8 / MASK_PER_S
    expected = {"advertise": advertise, "share": share, "masked": masked, "sum": 3 * 8 / ADD_PER_S, "unmask": unmask}
    for phase, seconds in expected.items():
        assert phases[phase] == pytest.approx(seconds, rel=1e-12), phase
    assert phases["server"] == pytest.approx(server, rel=1e-12)
    assert round_seconds(phases) == pytest.approx(sum(expected.values()), rel=1e-12)


@pytest.mark.parametrize("dropped", [0, 3])
def test_the_closed_form_is_the_general_computation_for_secagg(dropped: int) -> None:
    n = 12
    setup = RoundSetup(0, 1, 16, complete_graph(list(range(n))), 0.5)
    survivors = list(range(dropped, n))
    links = {c: Link(2.5e5, 2.5e6) for c in range(n)}
    general = phase_seconds(setup, survivors, round_bytes(setup.neighbours, survivors, 1024, 16), 1024, links)
    closed = uniform_round(n, n - 1, dropped, 1024, 16, 0.5, 2.5e5, 2.5e6)
    assert general.keys() == closed.keys()
    for phase in general:
        assert closed[phase] == pytest.approx(general[phase], rel=1e-12), phase


def test_the_closed_form_of_secagg_plus_without_dropouts_has_the_general_client_phases() -> None:
    """Every client of a Harary graph has k neighbours: the clients' phases agree exactly; the server's recovery
    counts one Lagrange set per secret (neighbourhoods can share their answering holders, which the general
    computation finds: it is never slower)."""
    setup = RoundSetup(0, 1, 16, harary_graph(list(range(20)), 4, 0, 1), 0.5)
    links = {c: Link(2.5e5, 2.5e6) for c in range(20)}
    general = phase_seconds(
        setup, list(range(20)), round_bytes(setup.neighbours, list(range(20)), 1024, 16), 1024, links
    )
    closed = uniform_round(20, 4, 0, 1024, 16, 0.5, 2.5e5, 2.5e6)
    for phase in ("advertise", "share", "masked", "sum"):
        assert closed[phase] == pytest.approx(general[phase], rel=1e-12), phase
    assert general["unmask"] <= closed["unmask"] and general["unmask"] == pytest.approx(closed["unmask"], rel=0.01)


def _clock(n: int) -> SyncClock:
    ones = np.ones(n)
    profiles = DeviceProfiles(
        speed=100 * ones, upload=1000 * ones, download=1e4 * ones, period_s=math.inf, online_start=0 * ones,
        online_length=ones,
    )  # fmt: skip
    return SyncClock(profiles)


def _record(schedule: RoundSchedule) -> RoundRecord:
    start = torch.zeros(5)
    record = RoundRecord(1, start, 0.0, start, configs={t.client_id: {} for t in schedule.run}, schedule=schedule)
    record.kept = [ClientUpdate(t.client_id, 1, start + 0.01 * (t.client_id + 1), num_examples=1) for t in schedule.run]
    return record


@pytest.mark.parametrize("deadline_wait", [False, True])
def test_on_the_clock_the_round_lasts_the_protocol(deadline_wait: bool) -> None:
    """Four clients sampled, three ran (one was dropped by the deadline: the clock's round waited until 50 s when
    ``deadline_wait``, else it ended with the last plain upload at 4.1 s). The stage replaces the schedule's round_s
    with the protocol's round, each survivor's masked input sent after its download and training."""
    run = tuple(Timing(c, 1, 0.5, 1.0 + c, 0.6) for c in range(3))
    schedule = RoundSchedule(0.0, 4, (0, 1, 2, 3), run, dropped_deadline=(3,), round_s=50.0 if deadline_wait else 4.1)
    record = _record(schedule)
    clock = _clock(4)
    metrics = SecureAggregation(seed=0, bits=16, clip=1.0, clock=clock).run(record)
    assert record.schedule is not None and record.schedule.round_s == metrics["time/round_s"]
    assert record.schedule.sampled == schedule.sampled and record.schedule.run == schedule.run
    assert metrics["time/plain_round_s"] == schedule.round_s
    ready = 0.5 + 1.0 + 2  # the last survivor: download and training
    masked = ready + 3 * AGREEMENT_S + 4 * 8 / MASK_PER_S + 16 / 1000 + 2 * 4 / 1e4  # k = 3 (4 in the cohort), 2 alive
    assert metrics["time/masked_s"] == pytest.approx(50.0 if deadline_wait else masked, rel=1e-12)
    phases = ("advertise", "share", "masked", "sum", "unmask")
    assert metrics["time/round_s"] == pytest.approx(sum(metrics[f"time/{p}_s"] for p in phases), rel=1e-12)
    clock.advance(record.schedule)  # what the clock stage does after measure
    assert clock.now_s == metrics["time/round_s"]


def test_without_a_clock_there_is_no_time() -> None:
    run = (Timing(0, 1, 0.5, 1.0, 0.6), Timing(1, 1, 0.5, 1.0, 0.6))
    record = _record(RoundSchedule(0.0, 2, (0, 1), run, round_s=2.1))
    metrics = SecureAggregation(seed=0).run(record)
    assert not any(k.startswith("time/") for k in metrics) and record.schedule is not None
    assert record.schedule.round_s == 2.1
