"""Device profiles: each simulated client's speed, bandwidths and daily online window, read by the simulated clock.

A client ``c`` processes ``speed[c]`` training examples per second, receives at ``download[c]`` and sends at
``upload[c]`` bytes per second, and is online once every ``period_s`` seconds, for ``online_length[c]`` seconds
from ``online_start[c]`` (the window may run past the period's end and wrap around; a window as long as the
period, or ``period_s = inf``, means always online). Profiles come from one of two sources:

* :func:`trace_profiles` reads them from a CSV trace, one row per client (format in :mod:`fedsim.sim.trace`;
  ``experiments/sim/example_trace.csv`` is a small illustrative one).
* :func:`sampled_profiles` draws them: speed and both bandwidths log-normal, independent per client, a
  parametric stand-in for the wide, skewed spread of real devices. FedScale (Lai et al., "FedScale:
  Benchmarking Model and System Performance of Federated Learning at Scale", ICML 2022) gives clients measured
  device profiles (compute from AI Benchmark, bandwidth from MobiPerf) that differ by orders of magnitude;
  FedBuff (Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022) simulates
  client training durations drawn at random and reports results under several such distributions.
  Availability is one window a day whose length is a Beta-distributed share of the day, starting at a uniform
  time: a simplification of the diurnal, idle-and-charging availability that Bonawitz et al. ("Towards
  Federated Learning at Scale: System Design", MLSys 2019) report.

**The defaults are assumptions, not quoted figures.** They were chosen to be of a realistic order for a small
CNN trained on a phone: a median of 100 examples/s, 2 Mbit/s up, 20 Mbit/s down (mobile uplinks of a few
Mbit/s, downlinks of tens), σ = 1 in log space for each (so the middle 95 % of clients span about ×50), and
online a quarter of the day on average. None is taken from the papers above; set them for the system you
model, or use a trace.

Every draw is a pure function of ``(seed, client)`` (one generator per client, as in :mod:`fedsim.server.stragglers`):
drawing for more clients never changes the first ones, and ``always_online`` changes no speed or bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedsim.core.checks import integer, number, within
from fedsim.sim.trace import BYTES_PER_S_PER_MBPS, HOURS_PER_DAY, SECONDS_PER_HOUR, read_trace

SECONDS_PER_DAY = HOURS_PER_DAY * SECONDS_PER_HOUR
SPEED_MEDIAN = 100.0  # examples per second (assumption: a small CNN on a phone)
UPLOAD_MEDIAN = 2.0 * BYTES_PER_S_PER_MBPS  # bytes per second: 2 Mbit/s (assumption)
DOWNLOAD_MEDIAN = 20.0 * BYTES_PER_S_PER_MBPS  # bytes per second: 20 Mbit/s (assumption)
LOG_SIGMA = 1.0  # σ of the natural log of speed and bandwidths (assumption)
ONLINE_FRACTION_MEAN = 0.25  # share of the period a client is online, on average (assumption)
ONLINE_FRACTION_CONCENTRATION = 10.0
"""``a + b`` of the Beta(a, b) the online fractions are drawn from (a larger value: fractions closer to the mean)."""
MIN_ONLINE_FRACTION = 1e-3
"""Online fractions are clipped below at this (86 s of a day), so every window is long enough to meet."""

_DOMAIN = 0x5133  # keeps the profile streams apart from any other stream of the same seed


def _checked_array(name: str, values: object) -> np.ndarray:
    arr = np.array(values, dtype=np.float64)  # a copy, made read-only below
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(
            f"DeviceProfiles.{name} must be a non-empty 1-D array, one value per client (got shape {arr.shape})"
        )
    arr.setflags(write=False)
    return arr


def _first_bad(name: str, arr: np.ndarray, ok: np.ndarray, bound: str) -> None:
    if not ok.all():
        c = int(np.flatnonzero(~ok)[0])
        raise ValueError(f"DeviceProfiles.{name} must be {bound} for every client (client {c} has {arr[c]!r})")


@dataclass(frozen=True, eq=False)
class DeviceProfiles:
    """The devices of ``num_clients`` clients; every array has one value per client, in client-id order.

    Arrays are copied as read-only ``float64``. Online windows are half-open: a client whose window starts at
    ``s`` with length ``L`` is online at ``t`` when ``(t - s) mod period_s < L``. With ``period_s = inf`` every
    client is always online, whatever ``online_start`` and ``online_length`` say.
    """

    speed: np.ndarray  # (num_clients,) training examples processed per second, > 0
    upload: np.ndarray  # (num_clients,) bytes per second, client -> server, > 0
    download: np.ndarray  # (num_clients,) bytes per second, server -> client, > 0
    period_s: float  # availability period in seconds (86 400: a day); math.inf: always online
    online_start: np.ndarray  # (num_clients,) seconds into the period the window opens, in [0, period_s)
    online_length: np.ndarray  # (num_clients,) seconds the window lasts, in (0, period_s]; == period_s: always

    def __post_init__(self) -> None:
        for name in ("speed", "upload", "download", "online_start", "online_length"):
            object.__setattr__(self, name, _checked_array(name, getattr(self, name)))
            if len(getattr(self, name)) != len(self.speed):
                raise ValueError(
                    f"DeviceProfiles.{name} has {len(getattr(self, name))} values but speed has "
                    f"{len(self.speed)}; give one value per client"
                )
        for name in ("speed", "upload", "download"):
            arr = getattr(self, name)
            _first_bad(name, arr, np.isfinite(arr) & (arr > 0), "finite and > 0")
        period = float(self.period_s)
        if not period > 0:
            raise ValueError(
                f"DeviceProfiles.period_s must be > 0 seconds, or inf for always online (got {self.period_s!r})"
            )
        object.__setattr__(self, "period_s", period)
        start, length = self.online_start, self.online_length
        _first_bad("online_start", start, (start >= 0) & (start < period), f"in [0, period_s={period:g})")
        _first_bad("online_length", length, (length > 0) & (length <= period), f"in (0, period_s={period:g}]")

    @property
    def num_clients(self) -> int:
        return len(self.speed)

    @property
    def always_online(self) -> bool:
        """Whether every client is online at every time."""
        return math.isinf(self.period_s) or bool(np.all(self.online_length >= self.period_s))

    def online(self, t: float) -> np.ndarray:
        """Boolean ``(num_clients,)``: who is online at simulated time ``t`` (seconds)."""
        if math.isinf(self.period_s):
            return np.ones(self.num_clients, dtype=bool)
        phase = np.mod(t - self.online_start, self.period_s)
        return (self.online_length >= self.period_s) | (phase < self.online_length)

    def online_at(self, client_id: int, t: float) -> bool:
        """Whether ``client_id`` is online at simulated time ``t`` (the same rule as :meth:`online`)."""
        length = float(self.online_length[client_id])
        if math.isinf(self.period_s) or length >= self.period_s:
            return True
        return (t - float(self.online_start[client_id])) % self.period_s < length

    def next_online(self, t: float) -> float:
        """The earliest time ``>= t`` at which some client is online (``t`` itself when someone already is).

        The result is nudged up by float rounding steps where needed, so that ``online(next_online(t))``
        always has a client online.
        """
        if self.online(t).any():
            return float(t)
        opens = t + (self.period_s - np.mod(t - self.online_start, self.period_s))  # each client's next window
        client = int(np.argmin(opens))
        when = float(opens[client])
        for _ in range(64):
            if self.online_at(client, when):
                return when
            when = float(np.nextafter(when, math.inf))
        return self.window_after(client, t)  # ``opens`` was off by more than 64 rounding steps (t ≪ period)

    def window_after(self, client_id: int, t: float) -> float:
        """When the first of ``client_id``'s windows that opens after ``t`` opens: ``start + k·period`` for the
        smallest whole k that makes it later than ``t``, nudged up by float rounding steps where needed so that the
        client is online then (:meth:`online_at`). Computed from k, not from ``t``'s phase, so the rounding error
        is that of one addition, not of ``period``."""
        start, k = (
            float(self.online_start[client_id]),
            math.floor((t - float(self.online_start[client_id])) / self.period_s),
        )
        when = start + k * self.period_s
        while when <= t:
            k += 1
            when = start + k * self.period_s
        for _ in range(64):
            if self.online_at(client_id, when):
                return when
            when = float(np.nextafter(when, math.inf))
        raise RuntimeError(f"DeviceProfiles.window_after: client {client_id}'s window at {when} s is too short to meet")


def _client_draws(seed: int, client: int, beta: tuple[float, float] | None) -> np.ndarray:
    """One client's draws: 3 standard normals (speed, upload, download), its online fraction, a uniform."""
    rng = np.random.default_rng([seed, _DOMAIN, client])
    z = rng.standard_normal(3)
    fraction = rng.beta(*beta) if beta is not None else 1.0
    return np.array([*z, fraction, rng.random()])


def sampled_profiles(
    num_clients: int,
    seed: int,
    *,
    speed_median: float = SPEED_MEDIAN,
    speed_sigma: float = LOG_SIGMA,
    upload_median: float = UPLOAD_MEDIAN,
    upload_sigma: float = LOG_SIGMA,
    download_median: float = DOWNLOAD_MEDIAN,
    download_sigma: float = LOG_SIGMA,
    period_s: float = SECONDS_PER_DAY,
    online_fraction_mean: float = ONLINE_FRACTION_MEAN,
    always_online: bool = False,
) -> DeviceProfiles:
    """Profiles drawn per client: ``median · exp(sigma · Z)`` for speed (examples/s), upload and download
    (bytes/s), so each is log-normal with the given median and ``sigma`` the std of its natural log.

    Each client is online once per ``period_s`` seconds, for a share of it drawn from
    ``Beta(m·k, (1−m)·k)`` (``m = online_fraction_mean`` in (0, 1], ``k`` = :data:`ONLINE_FRACTION_CONCENTRATION`;
    ``m = 1``: always online), from a start uniform in the period. ``always_online=True`` or
    ``period_s = inf``: everyone always online (``period_s`` becomes inf). ``seed``: an integer >= 0.
    """
    num_clients = integer("sampled_profiles: num_clients", num_clients, 1)
    seed = integer("sampled_profiles: seed", seed, 0)
    medians = [
        number(f"sampled_profiles: {n}", v, above=0)
        for n, v in (
            ("speed_median", speed_median),
            ("upload_median", upload_median),
            ("download_median", download_median),
        )
    ]
    sigmas = [
        number(f"sampled_profiles: {n}", v, at_least=0)
        for n, v in (("speed_sigma", speed_sigma), ("upload_sigma", upload_sigma), ("download_sigma", download_sigma))
    ]
    period = number("sampled_profiles: period_s", period_s, above=0, allow_inf=True)
    mean = within("sampled_profiles: online_fraction_mean", online_fraction_mean, "(0, 1]")
    k = ONLINE_FRACTION_CONCENTRATION
    beta = (mean * k, (1.0 - mean) * k) if mean < 1 else None
    draws = np.array([_client_draws(seed, c, beta) for c in range(num_clients)])
    speed, upload, download = (
        m * np.exp(s * draws[:, i]) for i, (m, s) in enumerate(zip(medians, sigmas, strict=True))
    )
    if always_online or math.isinf(period):
        period, start, length = math.inf, np.zeros(num_clients), np.full(num_clients, math.inf)
    else:
        start = np.minimum(draws[:, 4] * period, np.nextafter(period, 0.0))
        length = np.clip(draws[:, 3], MIN_ONLINE_FRACTION, 1.0) * period
    return DeviceProfiles(speed, upload, download, period, start, length)


def trace_profiles(path: str | Path, num_clients: int) -> DeviceProfiles:
    """Profiles of clients ``0 .. num_clients-1`` read from a CSV trace (format: :mod:`fedsim.sim.trace`).

    The period is a day (86 400 s). Rows for clients ``>= num_clients`` are checked but ignored; a missing
    client, like any other mistake, is a one-line ``ValueError`` (``FileNotFoundError`` for a missing file).
    """
    num_clients = integer("trace_profiles: num_clients", num_clients, 1)
    return DeviceProfiles(period_s=SECONDS_PER_DAY, **read_trace(path, num_clients))
