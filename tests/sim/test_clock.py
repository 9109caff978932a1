"""The simulated clock of synchronous rounds: known-answer timings and round rules, the clock in the server (same
weights as without it when nothing is dropped), the same simulated times under every executor, and exact resume."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsim.cli.run import build_server, compose
from fedsim.sim.clock import SyncClock, next_start_s, online_until, sampled_clock
from fedsim.sim.profiles import DeviceProfiles

DAY = 86_400.0


def _profiles(speed, upload, download, *, start=None, length=None, period=math.inf) -> DeviceProfiles:
    n = len(speed)
    return DeviceProfiles(
        speed=np.array(speed, float),
        upload=np.array(upload, float),
        download=np.array(download, float),
        period_s=period,
        online_start=np.zeros(n) if start is None else np.array(start, float),
        online_length=np.full(n, 1.0 if math.isinf(period) else period) if length is None else np.array(length, float),
    )


# four clients: 100 training examples each, a 1,000-byte model (250 parameters) each way
FOUR = _profiles(speed=[100, 50, 10, 200], upload=[1000, 500, 1000, 100], download=[1000, 1000, 250, 1000])
# total seconds with 1 epoch: download + compute + upload
#   client 0: 1 + 1 + 1 = 3;  client 1: 1 + 2 + 2 = 5;  client 2: 4 + 10 + 1 = 15;  client 3: 1 + 0.5 + 10 = 11.5


def _schedule(clock: SyncClock, sampled=(0, 1, 2, 3), k: int = 4, epochs: int = 1, partial: bool = False):
    return clock.schedule(
        list(sampled),
        clients_per_round=k,
        online=len(sampled),
        epochs={c: epochs for c in sampled},
        num_train={c: 100 for c in sampled},
        model_bytes=1000,
        update_bytes=1000,
        keeps_partial=partial,
    )


def test_task_time_is_download_plus_examples_over_speed_plus_upload() -> None:
    timing = SyncClock(FOUR).timing(2, epochs=3, num_train=40, model_bytes=1000, update_bytes=500)
    assert (timing.download_s, timing.compute_s, timing.upload_s) == (4.0, 12.0, 0.5) and timing.total_s == 16.5


def test_without_constraints_the_round_waits_for_the_slowest_client() -> None:
    schedule = _schedule(SyncClock(FOUR))
    assert [t.client_id for t in schedule.run] == [0, 1, 2, 3] and schedule.round_s == 15.0
    metrics = schedule.metrics()
    assert metrics["sim/time_s"] == 15.0 and metrics["sim/utilisation"] == (3 + 5 + 15 + 11.5) / (4 * 15)


def test_deadline_drops_late_clients_and_the_round_lasts_until_the_deadline() -> None:
    schedule = _schedule(SyncClock(FOUR, deadline_s=12.0))
    assert [t.client_id for t in schedule.run] == [0, 1, 3] and schedule.dropped_deadline == (2,)
    assert schedule.round_s == 12.0  # the server waited for client 2 until the deadline


def test_deadline_cuts_epochs_when_the_strategy_keeps_partial_work() -> None:
    # 4 epochs: client 0 takes 1 + 4 + 1 = 6 s, client 2 takes 4 + 40 + 1 = 45 s; deadline 30 s leaves client 2
    # 30 - 4 - 1 = 25 s of compute: 2 whole epochs of 10 s
    schedule = _schedule(SyncClock(FOUR, deadline_s=30.0), sampled=(0, 2), k=2, epochs=4, partial=True)
    assert schedule.epochs() == {0: 4, 2: 2} and schedule.cut_by_deadline == (2,)
    assert schedule.round_s == 25.0  # both arrived: client 2 uploads its 2 epochs at 4 + 20 + 1 s
    dropped = _schedule(SyncClock(FOUR, deadline_s=30.0), sampled=(0, 2), k=2, epochs=4, partial=False)
    assert dropped.epochs() == {0: 4} and dropped.dropped_deadline == (2,)
    too_tight = _schedule(SyncClock(FOUR, deadline_s=12.0), sampled=(0, 2), k=2, epochs=4, partial=True)
    assert too_tight.epochs() == {0: 4} and too_tight.dropped_deadline == (2,)  # not one 10 s epoch fits in 7 s
    assert too_tight.round_s == 12.0  # one of the two never arrives: the server waits until the deadline


def test_over_selection_ends_the_round_when_enough_arrived_even_if_one_is_late() -> None:
    schedule = _schedule(SyncClock(FOUR, deadline_s=12.0, over_selection=1.0), k=2)
    assert schedule.epochs() == {0: 1, 1: 1} and schedule.dropped_deadline == (2,) and schedule.round_s == 5.0


def test_over_selection_keeps_the_first_to_finish_with_ties_to_the_lower_id() -> None:
    clock = SyncClock(FOUR, over_selection=0.5)
    assert clock.sample_size(2, available=10) == 3 and clock.sample_size(4, available=5) == 5
    schedule = _schedule(clock, k=2)
    assert schedule.epochs() == {0: 1, 1: 1} and schedule.dropped_overselected == (2, 3) and schedule.round_s == 5.0
    tied = _profiles(speed=[100] * 3, upload=[1000] * 3, download=[1000] * 3)
    assert _schedule(SyncClock(tied, over_selection=1.0), sampled=(0, 1, 2), k=2).epochs() == {0: 1, 1: 1}


def test_availability_windows_sampling_and_dropping_out() -> None:
    # client 0 online 00:00-01:00, client 1 online 00:00-00:00:04 (4 s), client 2 online 12:00-13:00
    profiles = _profiles(
        speed=[100] * 3,
        upload=[1000] * 3,
        download=[1000] * 3,
        start=[0, 0, 43_200],
        length=[3600, 4, 3600],
        period=DAY,
    )
    clock = SyncClock(profiles)
    assert list(clock.online_clients()) == [0, 1]
    assert online_until(profiles, 1, 0.0) == 4.0 and online_until(profiles, 2, 0.0) == 0.0
    schedule = _schedule(clock, sampled=(0, 1), k=2)  # 3 s tasks; client 1 is gone after 4 s: fine
    assert schedule.epochs() == {0: 1, 1: 1}
    clock.now_s = 2.0  # now client 1's task would end at 5 s, after its window
    assert _schedule(clock, sampled=(0, 1), k=2).dropped_offline == (1,)
    clock.now_s = 4_000.0  # nobody online: the clock moves to noon, when client 2 is
    assert list(clock.online_clients()) == [2] and clock.now_s == 43_200.0


def test_a_client_can_start_a_task_only_with_some_of_its_window_left() -> None:
    """FedBuff starts a task on a client at :func:`next_start_s`: at once inside its window, else when the next
    window opens; a window closing at ``t`` itself does not count, however the rounding falls."""
    h = 3600.0
    profiles = _profiles([1], [1], [1], start=[8 * h], length=[6 * h], period=DAY)  # online 08:00-14:00
    assert next_start_s(profiles, 0, 3 * h) == 8 * h
    assert next_start_s(profiles, 0, 9 * h) == 9 * h
    assert next_start_s(profiles, 0, 14 * h) == DAY + 8 * h  # the window closes at 14:00: not startable then
    assert next_start_s(_profiles([1], [1], [1]), 0, 5.0) == 5.0  # always online
    for t in np.linspace(0.0, 3 * DAY, 997):  # every answer is a time with window left, and no window is skipped
        start = next_start_s(profiles, 0, float(t))
        assert start >= t and online_until(profiles, 0, start) > start
        assert start == t or start - t <= DAY - 6 * h + 1e-6


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"period_h": 0}, "clock.period_h must be a finite number > 0 (or inf) (got 0)"),
        ({"speed_median": -1.0}, "clock.speed_median must be a finite number > 0 (got -1.0)"),
        ({"upload_sigma": math.nan}, "clock.upload_sigma must be a finite number >= 0 (got nan)"),
        ({"download_mbps": 0.0}, "clock.download_mbps must be a finite number > 0 (got 0.0)"),
        ({"online_fraction_mean": 1.5}, "clock.online_fraction_mean must be in (0, 1] (got 1.5)"),
        ({"always_online": "no"}, "clock.always_online must be true or false (got 'no')"),
    ],
)
def test_sampled_clock_names_its_settings_as_the_config_does(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        sampled_clock(5, 0, **kwargs)
    assert str(caught.value) == message


def test_bad_clock_settings_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"clock.deadline_s must be > 0 or null \(got -1\)"):
        SyncClock(FOUR, deadline_s=-1)
    with pytest.raises(
        ValueError,
        match=r"clock.over_selection must be a finite number >= 0 \(got -0.1\); 0.3 samples 30 % more clients",
    ):
        SyncClock(FOUR, over_selection=-0.1)
    with pytest.raises(ValueError, match=r"example_trace.csv field client_id: no row for client\(s\) 20, 21"):
        build_server(compose(["clock=trace", "clock.path=experiments/sim/example_trace.csv"]))  # 20 rows, 30 clients
    with pytest.raises(ValueError, match=r"the device profiles describe 4 clients but the run has 30"):
        SyncClock(FOUR).check(30)
    with pytest.raises(ValueError, match=r"QFFL samples clients its own way"):
        build_server(
            compose(["clock=sampled", "clock.always_online=false", "strategy=qffl", "strategy.sampling=weighted"])
        )


SHORT = ["num_rounds=4", "logger=quiet", "clients_per_round=5", "eval_every=2"]


def test_an_always_online_clock_without_drops_leaves_every_weight_as_it_was() -> None:
    off = build_server(compose(SHORT)).run()
    on = build_server(compose([*SHORT, "clock=sampled"])).run()
    assert torch.equal(off.params, on.params)
    times = [r["sim/time_s"] for r in on.history]
    assert all(b > a > 0 for a, b in zip(times, times[1:], strict=False))
    assert all("sim/time_s" not in r for r in off.history)
    assert times[-1] == pytest.approx(sum(r["sim/round_s"] for r in on.history), rel=1e-12)


CLOCKED = [
    *SHORT,
    "clock=sampled",
    "clock.deadline_s=6",
    "clock.over_selection=0.4",
    "clock.always_online=false",
    "clock.online_fraction_mean=0.6",
    "strategy=fedprox",
    "client.epochs=3",
]
"""Every rule at work on the default Synthetic data (checked in the reference run): availability (16 of 30 online),
over-selection, clients dropped and cut by the deadline."""


def _sim(history: list[dict]) -> list[dict]:
    """Each round's metrics without the wall-clock and memory ones."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "system/"))} for r in history]


@pytest.fixture(scope="module")
def clocked_reference():
    return build_server(compose(CLOCKED)).run()


def test_the_reference_run_exercises_every_rule(clocked_reference) -> None:  # noqa: ANN001
    total = {
        k: sum(r[k] for r in clocked_reference.history)
        for k in ("sim/dropped_deadline", "sim/dropped_overselected", "sim/cut_by_deadline")
    }
    assert all(v >= 1 for v in total.values()), total
    assert clocked_reference.history[0]["sim/online"] < 30


# three workers for more clients than that: one worker trains several clients in turn (all that a single
# worker would show) while the others' results arrive in any order
def test_process_workers_give_the_same_metrics_and_simulated_times(clocked_reference) -> None:  # noqa: ANN001
    result = build_server(compose([*CLOCKED, "executor=process", "executor.devices=cpu", "executor.workers=3"])).run()
    assert _sim(result.history) == _sim(clocked_reference.history)
    assert torch.equal(result.params, clocked_reference.params)


def test_resume_continues_the_clock_exactly(tmp_path: Path, clocked_reference) -> None:  # noqa: ANN001
    first = tmp_path / "first"
    build_server(compose([*CLOCKED, "num_rounds=2", "checkpoint_every=1"]), first).run()
    resumed = build_server(compose([*CLOCKED, f"resume={first}"]), tmp_path / "second").run()
    assert _sim(resumed.history) == _sim(clocked_reference.history)
    assert torch.equal(resumed.params, clocked_reference.params)
