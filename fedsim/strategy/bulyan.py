"""Bulyan: Krum picks a majority of the updates one at a time, then a per-coordinate trimmed mean around the median.

El Mhamdi, Guerraoui, Rouault. "The Hidden Vulnerability of Distributed Learning in Byzantium." ICML 2018.

With n updates (the clients' weights) and f the Byzantine clients tolerated, n ≥ 4f + 3:

1. *Selection*: θ = n − 2f times, Krum (Blanchard et al. 2017) over the updates not picked yet picks the one whose
   squared distances to its r − f − 2 nearest others (r: the updates left; at least 1) sum least; it moves to the
   selection S.
2. *Aggregation*: per coordinate, the β = θ − 2f values of S closest to S's median are averaged.

Krum bounds how far a picked update can be from the honest ones; the trimmed mean then bounds each coordinate,
which Krum alone leaves to a single update (the weakness the paper shows: a large change in one coordinate).
Unweighted, as in the paper. Ties go to the lower client id (Krum's score, and the distance to the median), so the
result does not depend on the order of the updates; the median of an even number of values is the mean of the two
middle ones. float64 arithmetic. At the last picks fewer than f + 3 updates are left (2f + 1 at the very last),
so a Krum score there uses one neighbour, as Flower's ``aggregate_bulyan`` does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedsim.core.checks import integer
from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import Strategy
from fedsim.strategy.functional import coordinate_median, pairwise_squared_distances

_COLUMNS_PER_CHUNK = 1 << 16  # coordinates sorted at once in the aggregation step (bounds its memory)


def bulyan_select(stack: torch.Tensor, f: int) -> list[int]:
    """Indices (into dim 0 of ``stack``) of the θ = n − 2f rows Bulyan's selection picks, in the order picked."""
    n = stack.shape[0]
    distances = pairwise_squared_distances(stack)
    remaining, picked = list(range(n)), []
    for _ in range(n - 2 * f):
        neighbours = max(1, len(remaining) - f - 2)
        left = torch.tensor(remaining)
        among = distances[left][:, left]
        among.fill_diagonal_(float("inf"))  # a row's distance to itself sorts last, never among its neighbours
        scores = among.sort(dim=1).values[:, :neighbours].sum(dim=1)
        best = remaining[int(torch.sort(scores, stable=True).indices[0])]  # ties: the lower index
        picked.append(best)
        remaining.remove(best)
    return picked


def closest_to_median_mean(stack: torch.Tensor, beta: int) -> torch.Tensor:
    """Per coordinate, the mean of the ``beta`` values of ``stack`` (dim 0) closest to the coordinate's median
    (float64; equal distances go to the lower row)."""
    rows = stack.to(torch.float64).reshape(stack.shape[0], -1)
    if not 1 <= beta <= rows.shape[0]:
        raise ValueError(f"closest_to_median_mean needs 1 <= beta <= n (got beta={beta}, n={rows.shape[0]})")
    median = coordinate_median(rows)
    out = torch.empty(rows.shape[1], dtype=torch.float64)
    for start in range(0, rows.shape[1], _COLUMNS_PER_CHUNK):
        columns = rows[:, start : start + _COLUMNS_PER_CHUNK]
        nearest = (columns - median[start : start + _COLUMNS_PER_CHUNK]).abs().sort(dim=0, stable=True).indices[:beta]
        out[start : start + columns.shape[1]] = columns.gather(0, nearest).sum(dim=0) / beta
    return out.reshape(stack.shape[1:])


class Bulyan(Strategy):
    """w ← Bulyan's aggregate of the clients' weights: Krum picks θ = n − 2f, then the β = θ − 2f values closest to
    the median are averaged per coordinate. Needs n ≥ 4f + 3 updates.

    After :meth:`aggregate`, ``selected_client_ids`` names the clients Krum picked (in an attacked run the server
    reports how many were malicious: ``attack/malicious_selected``), and each client's row holds ``selected``
    (1 or 0; :meth:`client_metrics`).
    """

    def __init__(self, f: int = 1) -> None:
        self.f = integer("strategy.f", f, 0)
        self.selected_client_ids: list[int] | None = None
        self._received: list[int] = []

    def _require(self, n: int, where: str) -> None:
        if n < 4 * self.f + 3:
            raise ValueError(
                f"strategy=bulyan needs at least 4f+3 = {4 * self.f + 3} clients per round (f={self.f}) "
                f"but {where} {n}; lower strategy.f or raise clients_per_round"
            )

    def check(self, clients_per_round: int) -> None:
        self._require(clients_per_round, "clients_per_round is")

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        self._require(len(updates), "the round has")
        ordered = sorted(updates, key=lambda u: u.client_id)
        stack = torch.stack([u.params for u in ordered])
        picked = sorted(bulyan_select(stack, self.f))  # S in client-id order
        self.selected_client_ids = [ordered[i].client_id for i in picked]
        self._received = [u.client_id for u in ordered]
        theta = len(ordered) - 2 * self.f
        return closest_to_median_mean(stack[picked], theta - 2 * self.f).to(global_params.dtype)

    def client_metrics(self, round_num: int) -> dict[int, dict[str, float]]:
        """Each aggregated client's ``selected``: 1 if Krum picked its update, else 0."""
        kept = set(self.selected_client_ids or ())
        return {client_id: {"selected": float(client_id in kept)} for client_id in self._received}
