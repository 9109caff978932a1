"""The simulated clock of synchronous rounds: how long each client's task takes, and so each round.

A pure function of the device profiles (:mod:`fedsim.sim.profiles`), the work a task is given and the bytes it
moves, never of the wall clock: serial, process and Ray runs report the same simulated times bit for bit, and a
resumed run continues the clock where the checkpoint left it.

Time model of one client's task, started when the round starts:

* download: the global model's bytes (float32: 4 bytes per parameter) / the client's download bandwidth;
* compute: the examples it trains on (its training set × the epochs it is given) / its speed in examples per second;
* upload: its update's bytes / its upload bandwidth.

A round (the FedAvg-style synchronous round, as simulated by FedScale, Lai et al. ICML 2022, and used as the
baseline of FedBuff, Nguyen et al. AISTATS 2022):

1. **Availability.** Only clients online when the round starts can be sampled; if none is, the clock first moves
   to the next time some client is. A client whose online window ends before its task would finish drops out
   (``sim/dropped_offline``).
2. **Over-selection** (``over_selection`` = s): ``ceil(K (1 + s))`` clients are sampled and the first K to finish
   are kept (ties broken by client id); the others are dropped (``sim/dropped_overselected``).
3. **Deadline** (``deadline_s``): a client that would finish after it is dropped (``sim/dropped_deadline``), or,
   when the strategy keeps partial work (``Strategy.keeps_stragglers``, e.g. FedProx), trains only the whole
   epochs that fit before it (``sim/cut_by_deadline``; dropped if not even one fits).

Clients dropped by the clock are decided before the round's tasks are sent, from their planned timings, and are
not trained at all: the simulated outcome is the same as if they had trained and been ignored, at no compute cost.

The round ends when ``clients_per_round`` updates have arrived (with over-selection: the K-th to finish); or at the
deadline, when fewer arrive by then because some missed it (the server cannot know in advance who will be late);
otherwise (clients dropped out offline) when the last kept client's update arrives. A client cut by the deadline
sends its partial work as soon as its last whole epoch is done.
``sim/utilisation`` is the share of the sampled clients' round time spent on work that was aggregated:
Σ_kept task time / (sampled clients × round time).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedsim.core.checks import number, within
from fedsim.sim.profiles import BYTES_PER_S_PER_MBPS, DeviceProfiles, sampled_profiles, trace_profiles

BYTES_PER_PARAMETER = 4  # float32, what fedsim sends each way


@dataclass(frozen=True)
class Timing:
    """One client's task on the clock: the epochs it trains and the seconds of each phase."""

    client_id: int
    epochs: int
    download_s: float
    compute_s: float
    upload_s: float

    @property
    def total_s(self) -> float:
        return self.download_s + self.compute_s + self.upload_s


@dataclass(frozen=True)
class RoundSchedule:
    """What the clock decided for one round: who trains (with how many epochs), who was dropped and why, and
    how long the round lasts."""

    start_s: float
    online: int
    sampled: tuple[int, ...]
    run: tuple[Timing, ...]  # the tasks sent, in client-id order
    dropped_offline: tuple[int, ...] = ()
    dropped_deadline: tuple[int, ...] = ()
    dropped_overselected: tuple[int, ...] = ()
    cut_by_deadline: tuple[int, ...] = ()
    round_s: float = 0.0
    download_bytes: int = 0  # what the sampled clients downloaded in all (the dropped ones too)

    @property
    def end_s(self) -> float:
        return self.start_s + self.round_s

    def epochs(self) -> dict[int, int]:
        """Epochs of every task that runs, by client id."""
        return {t.client_id: t.epochs for t in self.run}

    def metrics(self) -> dict[str, float]:
        """The round's ``sim/`` scalars (``sim/time_s`` is the clock when the round ends)."""
        busy = sum(t.total_s for t in self.run)
        share = busy / (len(self.sampled) * self.round_s) if self.sampled and self.round_s > 0 else 0.0
        return {
            "sim/time_s": self.end_s,
            "sim/round_s": self.round_s,
            "sim/online": float(self.online),
            "sim/dropped_offline": float(len(self.dropped_offline)),
            "sim/dropped_deadline": float(len(self.dropped_deadline)),
            "sim/dropped_overselected": float(len(self.dropped_overselected)),
            "sim/cut_by_deadline": float(len(self.cut_by_deadline)),
            "sim/utilisation": share,
        }


def online_until(profiles: DeviceProfiles, client_id: int, t: float) -> float:
    """When the online window that contains ``t`` ends for ``client_id`` (``inf``: always online; ``t``: offline)."""
    period, length = profiles.period_s, float(profiles.online_length[client_id])
    if math.isinf(period) or length >= period:
        return math.inf
    phase = (t - float(profiles.online_start[client_id])) % period
    return t + (length - phase) if phase < length else t


def can_start(profiles: DeviceProfiles, client_id: int, t: float) -> bool:
    """Whether ``client_id`` can start a task at ``t``: online with some of its window left (:func:`online_until`
    later than ``t`` itself, so a window that closes at ``t`` to float rounding does not count)."""
    return online_until(profiles, client_id, t) > t


def next_start_s(profiles: DeviceProfiles, client_id: int, t: float) -> float:
    """The earliest time ``>= t`` at which ``client_id`` can start a task (:func:`can_start`): ``t`` itself, or
    when one of its next windows opens; inf for a window too short for float time to start a task in."""
    when = float(t)
    for _ in range(4):
        if can_start(profiles, client_id, when):
            return when
        when = profiles.window_after(client_id, when)
    return math.inf


class SyncClock:
    """The clock of a synchronous run; ``now_s`` is the simulated time at which the next round starts.

    ``deadline_s``: None or > 0. ``over_selection``: ≥ 0, the extra share of clients sampled (0.3: 30 % more).
    """

    def __init__(
        self, profiles: DeviceProfiles, *, deadline_s: float | None = None, over_selection: float = 0.0
    ) -> None:
        if deadline_s is not None and not (math.isfinite(deadline_s) and deadline_s > 0):
            raise ValueError(f"clock.deadline_s must be > 0 or null (got {deadline_s!r})")
        number("clock.over_selection", over_selection, at_least=0, hint="; 0.3 samples 30 % more clients")
        self.profiles = profiles
        self.deadline_s = None if deadline_s is None else float(deadline_s)
        self.over_selection = float(over_selection)
        self.now_s = 0.0

    def check(self, num_clients: int) -> None:
        """Refuse, in one line, profiles for another number of clients."""
        if self.profiles.num_clients != num_clients:
            raise ValueError(
                f"clock: the device profiles describe {self.profiles.num_clients} clients but the run has "
                f"{num_clients}; give a profile (trace row) for every client"
            )

    def sample_size(self, clients_per_round: int, available: int) -> int:
        """How many clients to sample: ``ceil(K (1 + over_selection))``, at most the ``available`` ones."""
        return min(available, math.ceil(clients_per_round * (1 + self.over_selection) - 1e-9))

    def online_clients(self) -> np.ndarray:
        """Ids of the clients online at ``now_s``, after moving ``now_s`` to the next time anyone is, if nobody is."""
        online = np.flatnonzero(self.profiles.online(self.now_s))
        if online.size == 0:
            self.now_s = float(self.profiles.next_online(self.now_s))
            online = np.flatnonzero(self.profiles.online(self.now_s))
        return online

    def timing(self, client_id: int, *, epochs: int, num_train: int, model_bytes: int, update_bytes: int) -> Timing:
        """The planned timing of one task (see the module docstring)."""
        p = self.profiles
        return Timing(
            client_id,
            epochs,
            model_bytes / float(p.download[client_id]),
            epochs * num_train / float(p.speed[client_id]),
            update_bytes / float(p.upload[client_id]),
        )

    def schedule(
        self,
        sampled: Sequence[int],
        *,
        clients_per_round: int,
        online: int,
        epochs: Mapping[int, int],
        num_train: Mapping[int, int],
        model_bytes: int | Mapping[int, int],
        update_bytes: int,
        keeps_partial: bool,
    ) -> RoundSchedule:
        """Decide the round that starts at ``now_s`` with the ``sampled`` clients (see the module docstring);
        ``model_bytes``: what each client downloads, one number for all or by client id."""
        down = {c: model_bytes if isinstance(model_bytes, int) else model_bytes[c] for c in sampled}
        plans = [
            self.timing(c, epochs=epochs[c], num_train=num_train[c], model_bytes=down[c], update_bytes=update_bytes)
            for c in sorted(sampled)
        ]
        plans, offline = self._drop_offline(plans)
        plans, late, cut = self._apply_deadline(plans, keeps_partial)
        plans, surplus = self._keep_first(plans, clients_per_round)
        last = max((t.total_s for t in plans), default=0.0)
        short = len(plans) < min(clients_per_round, len(sampled))  # someone sent never arrives
        round_s = self.deadline_s if short and late and self.deadline_s is not None else last
        return RoundSchedule(
            start_s=self.now_s,
            online=online,
            sampled=tuple(sorted(sampled)),
            run=tuple(plans),
            dropped_offline=offline,
            dropped_deadline=late,
            dropped_overselected=surplus,
            cut_by_deadline=cut,
            round_s=float(round_s),
            download_bytes=sum(down.values()),
        )

    def advance(self, schedule: RoundSchedule) -> None:
        """The next round starts when this one ends."""
        self.now_s = schedule.end_s

    def _drop_offline(self, plans: list[Timing]) -> tuple[list[Timing], tuple[int, ...]]:
        """Tasks whose client goes offline before they finish drop out."""
        ok = [t for t in plans if online_until(self.profiles, t.client_id, self.now_s) >= self.now_s + t.total_s]
        return ok, tuple(t.client_id for t in plans if t not in ok)

    def _apply_deadline(
        self, plans: list[Timing], keeps_partial: bool
    ) -> tuple[list[Timing], tuple[int, ...], tuple[int, ...]]:
        """(tasks that meet the deadline, possibly cut to fewer epochs; dropped ids; cut ids)."""
        if self.deadline_s is None:
            return plans, (), ()
        kept, late, cut = [], [], []
        for t in plans:
            if t.total_s <= self.deadline_s:
                kept.append(t)
                continue
            fits = self._epochs_before_deadline(t) if keeps_partial else 0
            if fits >= 1:
                kept.append(Timing(t.client_id, fits, t.download_s, t.compute_s * fits / t.epochs, t.upload_s))
                cut.append(t.client_id)
            else:
                late.append(t.client_id)
        return kept, tuple(late), tuple(cut)

    def _epochs_before_deadline(self, t: Timing) -> int:
        """Whole epochs of ``t`` that fit between its download and an upload that ends at the deadline."""
        per_epoch = t.compute_s / t.epochs if t.epochs else math.inf
        assert self.deadline_s is not None  # called by _apply_deadline only with a deadline
        room = self.deadline_s - t.download_s - t.upload_s
        return int(min(t.epochs - 1, math.floor(room / per_epoch))) if per_epoch > 0 and room > 0 else 0

    def _keep_first(self, plans: list[Timing], clients_per_round: int) -> tuple[list[Timing], tuple[int, ...]]:
        """With over-selection, the first ``clients_per_round`` to finish (ties: lower id first)."""
        if self.over_selection == 0 or len(plans) <= clients_per_round:
            return plans, ()
        first = sorted(plans, key=lambda t: (t.total_s, t.client_id))[:clients_per_round]
        kept = sorted(first, key=lambda t: t.client_id)
        return kept, tuple(sorted(t.client_id for t in plans if t not in kept))

    def state_dict(self) -> dict[str, float]:
        return {"now_s": self.now_s}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        self.now_s = float(state["now_s"])


def sampled_clock(
    num_clients: int,
    seed: int,
    *,
    deadline_s: float | None = None,
    over_selection: float = 0.0,
    speed_median: float = 100.0,
    speed_sigma: float = 1.0,
    upload_mbps: float = 2.0,
    upload_sigma: float = 1.0,
    download_mbps: float = 20.0,
    download_sigma: float = 1.0,
    always_online: bool = True,
    period_h: float = 24.0,
    online_fraction_mean: float = 0.25,
) -> SyncClock:
    """``clock=sampled``: profiles drawn per client from ``seed`` (:func:`fedsim.sim.profiles.sampled_profiles`;
    speeds in examples/s, bandwidths in Mbit/s, medians and log-scale sigmas), then a :class:`SyncClock`. Its
    arguments are checked here, each refused in one line that names it as the config does (``clock.period_h``)."""
    for name, value in (("speed_median", speed_median), ("upload_mbps", upload_mbps), ("download_mbps", download_mbps)):
        number(f"clock.{name}", value, above=0)
    for name, value in (
        ("speed_sigma", speed_sigma),
        ("upload_sigma", upload_sigma),
        ("download_sigma", download_sigma),
    ):
        number(f"clock.{name}", value, at_least=0)
    number("clock.period_h", period_h, above=0, allow_inf=True)
    within("clock.online_fraction_mean", online_fraction_mean, "(0, 1]")
    if not isinstance(always_online, bool):
        raise ValueError(f"clock.always_online must be true or false (got {always_online!r})")
    profiles = sampled_profiles(
        num_clients,
        seed,
        speed_median=speed_median,
        speed_sigma=speed_sigma,
        upload_median=upload_mbps * BYTES_PER_S_PER_MBPS,
        upload_sigma=upload_sigma,
        download_median=download_mbps * BYTES_PER_S_PER_MBPS,
        download_sigma=download_sigma,
        period_s=period_h * 3600.0,
        online_fraction_mean=online_fraction_mean,
        always_online=always_online,
    )
    return SyncClock(profiles, deadline_s=deadline_s, over_selection=over_selection)


def trace_clock(
    num_clients: int, seed: int, *, path: str, deadline_s: float | None = None, over_selection: float = 0.0
) -> SyncClock:
    """``clock=trace``: every client's profile from a CSV trace (:mod:`fedsim.sim.trace` has the format);
    ``seed`` is not used."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"clock.path must be the path of a CSV trace (got {path!r}); quote a name made of digits")
    return SyncClock(trace_profiles(path, num_clients), deadline_s=deadline_s, over_selection=over_selection)
