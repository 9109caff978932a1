"""How long one round of SecAgg or SecAgg+ takes on the simulated clock: the protocol's bytes over each client's
bandwidth and a simple compute model, phase by phase (docs/secure-aggregation.md, "Time").

**Compute model** (one core at each party; the constants below, of the order of commodity phones and servers):

| work | seconds |
|---|---|
| a key generation or key agreement (X25519) | A = 1e-4 |
| expanding one b-bit mask coordinate from a seed (a PRG at about 400 MB/s) | 1/P, P = 1e8 a second |
| a multiplication in GF(2^127 − 1) (a Shamir share, a Lagrange term) | F = 1e-7 |
| the server adding one coordinate of a masked input | 1/Q, Q = 1e9 a second |

Client u, with kᵤ neighbours and threshold tᵤ: ``advertise`` 2 key generations (2A); ``share`` kᵤ agreements for
the share encryption and 2 polynomials of degree tᵤ − 1 at kᵤ + 1 points (kᵤ·A + 2(kᵤ + 1)·tᵤ·F); ``masked`` kᵤ
agreements and (kᵤ + 1)·d' mask coordinates (kᵤ·A + (kᵤ + 1)·d'/P). The server: after ``masked``, the sum of the m
masked inputs (m·d'/Q); in ``unmask``, Lagrange coefficients once per distinct set of t answering holders (t²·F)
and t·F per secret recovered, each survivor's self-mask (d'/P) and, for each dropped client v with surviving
neighbours, an agreement and a mask for each such neighbour (A + d'/P each).

**Phases.** A phase ends when the slowest client taking part is done: its compute, what it sends over its upload
bandwidth and what it receives over its download bandwidth (the clock's device profiles; the server's own link is
not the bottleneck). ``advertise`` and ``share`` involve the whole cohort and run when the round starts, before the
clients download the model; ``masked`` ends when the last survivor, having downloaded and trained as the clock
planned, has masked its input and sent it (at least as late as the clock's own round end when that waited for the
deadline); then the server sums, and ``unmask`` ends with the server's recovery. So

    round = advertise + share + masked + server sum + unmask.

Who makes the deadline, drops out offline or is over-selected is still the clock's decision at the plan, timed with
the plain upload (the plan comes before any stage of secure aggregation); the protocol then lengthens the round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from fedsim.secagg.costs import client_phase_bytes
from fedsim.secagg.protocol import RoundSetup, threshold_of
from fedsim.server.record import RoundRecord
from fedsim.sim.profiles import DeviceProfiles

AGREEMENT_S = 1e-4
MASK_PER_S = 1e8
FIELD_OP_S = 1e-7
ADD_PER_S = 1e9


@dataclass(frozen=True)
class Link:
    """A client's ``up`` and ``down`` bandwidth (bytes a second) and ``ready_s``: when, after the key phases, it
    has downloaded the model and trained (0 without a clock)."""

    up: float
    down: float
    ready_s: float = 0.0


def client_compute_s(phase: str, degree: int, threshold: int, coordinates: int) -> float:
    """Seconds of one client's compute in ``phase`` (module docstring)."""
    if phase == "advertise":
        return 2 * AGREEMENT_S
    if phase == "share":
        return degree * AGREEMENT_S + 2 * (degree + 1) * threshold * FIELD_OP_S
    if phase == "masked":
        return degree * AGREEMENT_S + (degree + 1) * coordinates / MASK_PER_S
    return 0.0


def server_unmask_s(setup: RoundSetup, survivors: Sequence[int], coordinates: int) -> float:
    """Seconds of the server's recovery: the Lagrange work for every secret it needs and the masks it removes."""
    alive, holder_sets, field_ops, masks, agreements = set(survivors), set(), 0, 0, 0
    for client in setup.cohort:
        partners = [u for u in setup.neighbours[client] if u in alive]
        if client not in alive and not partners:
            continue
        holders = setup.holders(client)
        t = threshold_of(setup.threshold, len(holders))
        answering = tuple(h for h in holders if h in alive)[:t]
        if answering not in holder_sets:
            holder_sets.add(answering)
            field_ops += t * t
        field_ops += t
        masks += 1 if client in alive else len(partners)
        agreements += 0 if client in alive else len(partners)
    return field_ops * FIELD_OP_S + masks * coordinates / MASK_PER_S + agreements * AGREEMENT_S


def phase_seconds(
    setup: RoundSetup,
    survivors: Sequence[int],
    per_client: Mapping[int, Mapping[str, tuple[int, int]]],
    coordinates: int,
    links: Mapping[int, Link],
) -> dict[str, float]:
    """Each phase's seconds (``advertise``, ``share``, ``masked``, ``sum``, ``unmask``) and the ``server`` compute
    in them, for the round's bytes ``per_client`` (:func:`fedsim.secagg.costs.round_bytes`) and each client's link."""
    alive = set(survivors)

    def slowest(phase: str, clients: Sequence[int], ready: bool = False) -> float:
        times = [0.0]
        for c in clients:
            k, link = len(setup.neighbours[c]), links[c]
            t = threshold_of(setup.threshold, k + 1)
            sent, received = per_client[c][phase]
            start = link.ready_s if ready else 0.0
            times.append(start + client_compute_s(phase, k, t, coordinates) + sent / link.up + received / link.down)
        return max(times)

    cohort = setup.cohort
    server_sum = len(alive) * coordinates / ADD_PER_S
    server_unmask = server_unmask_s(setup, survivors, coordinates)
    return {
        "advertise": slowest("advertise", cohort),
        "share": slowest("share", cohort),
        "masked": slowest("masked", [c for c in cohort if c in alive], ready=True),
        "sum": server_sum,
        "unmask": slowest("unmask", [c for c in cohort if c in alive]) + server_unmask,
        "server": server_sum + server_unmask,
    }


def round_seconds(phases: Mapping[str, float]) -> float:
    """The round's length: its phases one after the other (the ``server`` entry is inside ``sum`` and ``unmask``)."""
    return sum(phases[p] for p in ("advertise", "share", "masked", "sum", "unmask"))


def uniform_round(
    cohort: int, degree: int, dropped: int, coordinates: int, bits: int, threshold: float, up: float, down: float
) -> dict[str, float]:
    """:func:`phase_seconds` in closed form for a cohort too large to build: every client has ``degree``
    neighbours, bandwidths ``up`` and ``down`` and no training (``ready_s`` = 0), and ``dropped`` clients drop
    out after the key phases, each client's neighbours among them in proportion, d/(n − 1) (exact for SecAgg's
    complete graph; for SecAgg+ the mean over its random graphs, rounded)."""
    t = threshold_of(threshold, degree + 1)
    lost = round(degree * dropped / (cohort - 1)) if cohort > 1 else 0  # a client's dropped neighbours
    alive = cohort - dropped
    survivor = client_phase_bytes(degree, degree - lost, True, coordinates, bits)
    leaver = client_phase_bytes(degree, degree - lost, False, coordinates, bits)

    def slowest(phase: str) -> float:
        parties = [survivor] + ([leaver] if dropped and phase in ("advertise", "share") else [])
        return client_compute_s(phase, degree, t, coordinates) + max(
            sent / up + received / down for sent, received in (p[phase] for p in parties)
        )

    partners = degree - (round(degree * (dropped - 1) / (cohort - 1)) if dropped else 0)  # a dropped one's survivors
    secrets = alive + (dropped if partners else 0)  # a dropped client's key is needed if a neighbour survived
    holder_sets = 1 if degree >= cohort - 1 else secrets
    masks = alive + dropped * partners
    unmask = (holder_sets * t * t + secrets * t) * FIELD_OP_S + masks * coordinates / MASK_PER_S
    unmask += dropped * partners * AGREEMENT_S
    server_sum = alive * coordinates / ADD_PER_S
    return {
        "advertise": slowest("advertise"),
        "share": slowest("share"),
        "masked": slowest("masked"),
        "sum": server_sum,
        "unmask": slowest("unmask") + unmask,
        "server": server_sum + unmask,
    }


def on_the_clock(
    record: RoundRecord,
    setup: RoundSetup,
    survivors: Sequence[int],
    per_client: Mapping[int, Mapping[str, tuple[int, int]]],
    coordinates: int,
    profiles: DeviceProfiles,
) -> dict[str, float]:
    """Put the protocol's phases on the round's simulated clock: ``record.schedule`` is replaced by one whose
    ``round_s`` is the protocol's round (:func:`round_seconds`), which the clock stage then logs as ``sim/round_s``
    and moves the clock by. The clients' links from ``profiles``, each survivor ready when the clock's plan has it
    downloaded and trained. Returns the ``time/<phase>_s`` metrics, ``time/round_s`` and ``time/plain_round_s``
    (the clock's round with the plain upload)."""
    schedule = record.schedule
    assert schedule is not None  # the caller checks that the round runs on the clock
    plans = {t.client_id: t for t in schedule.run}
    links = {
        c: Link(
            float(profiles.upload[c]),
            float(profiles.download[c]),
            plans[c].download_s + plans[c].compute_s if c in plans else 0.0,
        )
        for c in setup.cohort
    }
    phases = phase_seconds(setup, survivors, per_client, coordinates, links)
    last = max((t.total_s for t in schedule.run), default=0.0)
    if schedule.round_s > last:  # the clock's round waited for its deadline: so does the masked input's phase
        phases["masked"] = max(phases["masked"], schedule.round_s)
    total = round_seconds(phases)
    record.schedule = replace(schedule, round_s=total)
    return {f"time/{phase}_s": seconds for phase, seconds in phases.items()} | {
        "time/round_s": total,
        "time/plain_round_s": schedule.round_s,
    }
