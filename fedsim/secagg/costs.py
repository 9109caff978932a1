"""The bytes of one round of SecAgg or SecAgg+, per client and at the server, phase by phase (the semi-honest
protocol of :mod:`fedsim.secagg.protocol`: no signatures, no consistency check).

Sizes assumed (constants below): a public key K = 32 bytes (an X25519 key; fedsim simulates the agreement in a
127-bit field, see :mod:`fedsim.secagg.masking`), a Shamir share S = 16 bytes (one element of GF(2^127 - 1)), a
client id I = 4 bytes, and an encrypted pair of shares C = 2·I + 2·S + 16 = 56 bytes (sender and recipient ids, the
two shares, a 16-byte authentication tag of authenticated encryption). For client u with k_u = |N(u)| neighbours
(k_u = n - 1 in SecAgg), of whom a_u survived, d' coordinates of b bits each:

| phase | client u sends | client u receives |
|---|---|---|
| ``advertise``: public keys | 2·K | k_u·(I + 2·K) (each neighbour's two keys) |
| ``share``: encrypted shares | k_u·(I + C) | k_u·(I + C) |
| ``masked``: the masked input (survivors only) | ⌈d'·b/8⌉ | a_u·I (which neighbours survived) |
| ``unmask``: shares for recovery (survivors only) | (k_u + 1)·(I + S) | 0 |

A client that drops out after the key phases takes part in ``advertise`` and ``share`` only. Every message goes
through the server, so the server's bytes in a phase are the sum over the clients of what they send and receive.
With every client surviving and k neighbours each, a client moves
2K + k(I + 2K) + 2k(I + C) + ⌈d'b/8⌉ + k·I + (k + 1)(I + S) bytes and the server n times that: O(n + d') per
client and O(n² + n·d') at the server for SecAgg (k = n - 1), O(log n + d') and O(n log n + n·d') for SecAgg+
(k of order log n), the asymptotics both papers state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedsim.server.record import RoundRecord

KEY_BYTES = 32
SHARE_BYTES = 16
ID_BYTES = 4
TAG_BYTES = 16
CIPHERTEXT_BYTES = 2 * ID_BYTES + 2 * SHARE_BYTES + TAG_BYTES
PHASES = ("advertise", "share", "masked", "unmask")


def client_phase_bytes(
    degree: int, surviving_neighbours: int, survived: bool, coordinates: int, bits: int
) -> dict[str, tuple[int, int]]:
    """(sent, received) bytes of one client in each phase (module docstring's table)."""
    masked = ((coordinates * bits + 7) // 8, surviving_neighbours * ID_BYTES) if survived else (0, 0)
    unmask = ((degree + 1) * (ID_BYTES + SHARE_BYTES), 0) if survived else (0, 0)
    return {
        "advertise": (2 * KEY_BYTES, degree * (ID_BYTES + 2 * KEY_BYTES)),
        "share": (degree * (ID_BYTES + CIPHERTEXT_BYTES), degree * (ID_BYTES + CIPHERTEXT_BYTES)),
        "masked": masked,
        "unmask": unmask,
    }


def round_bytes(
    neighbours: Mapping[int, Sequence[int]], survivors: Sequence[int], coordinates: int, bits: int
) -> dict[int, dict[str, tuple[int, int]]]:
    """Every client's (sent, received) bytes by phase, for a round with this graph and these survivors."""
    alive = set(survivors)
    return {
        c: client_phase_bytes(len(n), len(alive.intersection(n)), c in alive, coordinates, bits)
        for c, n in neighbours.items()
    }


def cost_metrics(per_client: Mapping[int, Mapping[str, tuple[int, int]]]) -> dict[str, float]:
    """The round's byte metrics: for each phase the most any client moved (sent + received) and the server's total
    (``<phase>/bytes_client_max``, ``<phase>/bytes_server``), and the same over all phases (``bytes_client_max``,
    ``bytes_server``), plus the totals each way (``bytes_up``: clients to server, ``bytes_down``: server to clients)."""
    metrics: dict[str, float] = {}
    for phase in PHASES:
        moved = [sum(p[phase]) for p in per_client.values()] or [0]
        metrics[f"{phase}/bytes_client_max"] = float(max(moved))
        metrics[f"{phase}/bytes_server"] = float(sum(moved))
    totals = [sum(sum(b) for b in p.values()) for p in per_client.values()] or [0]
    metrics["bytes_client_max"] = float(max(totals))
    metrics["bytes_server"] = float(sum(totals))
    metrics["bytes_up"] = float(sum(b[0] for p in per_client.values() for b in p.values()))
    metrics["bytes_down"] = float(sum(b[1] for p in per_client.values() for b in p.values()))
    return metrics


def cohort_bytes(cohort: int, degree: int, coordinates: int, bits: int) -> tuple[int, int]:
    """(bytes per client, bytes at the server) of a round in which every one of ``cohort`` clients has ``degree``
    neighbours and survives: the closed form of the module docstring, for cohorts too large to train."""
    per_client = sum(sum(b) for b in client_phase_bytes(degree, degree, True, coordinates, bits).values())
    return per_client, cohort * per_client


class CommLedger:
    """The ``comm/`` metrics of a round as secure aggregation moves the bytes: the uplink is what the clients send
    in its phases (the masked input in place of the update), the downlink gains what they receive. Keeps what it
    changed in the exchange's running totals so far (``up_offset``, ``down_offset``: the stage's state)."""

    def __init__(self) -> None:
        self.up_offset, self.down_offset = 0, 0

    def apply(self, record: RoundRecord, per_client: Mapping[int, Mapping[str, tuple[int, int]]]) -> dict[str, float]:
        """The round's byte metrics (:func:`cost_metrics`); each client row's bytes and ``record``'s ``comm/``
        metrics set to secure aggregation's."""
        metrics = cost_metrics(per_client)
        for cid, phases in per_client.items():
            down = record.client_extras.get(cid, {}).get("bytes_down", 0)
            sent, received = sum(p[0] for p in phases.values()), sum(p[1] for p in phases.values())
            record.add_to_rows(cid, bytes_up=sent, bytes_down=down + received)
        comm = record.metrics
        if "comm/bytes_up" in comm:
            self.up_offset += int(metrics["bytes_up"] - comm["comm/bytes_up"])
            self.down_offset += int(metrics["bytes_down"])
            comm["comm/bytes_up"], comm["comm/bytes_down"] = (
                metrics["bytes_up"],
                comm["comm/bytes_down"] + metrics["bytes_down"],
            )
            comm["comm/bytes_up_total"] += self.up_offset
            comm["comm/bytes_down_total"] += self.down_offset
            comm["comm/mb_total"] = (comm["comm/bytes_up_total"] + comm["comm/bytes_down_total"]) / 1e6
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """The offsets added to the exchange's totals so far."""
        return {"bytes_up_offset": self.up_offset, "bytes_down_offset": self.down_offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put the offsets back (a resume)."""
        self.up_offset, self.down_offset = int(state["bytes_up_offset"]), int(state["bytes_down_offset"])
