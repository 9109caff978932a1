"""Byzantine-robust aggregation: coordinate-wise median, trimmed mean, Krum and Multi-Krum.

Yin, Chen, Ramchandran, Bartlett. "Byzantine-Robust Distributed Learning: Towards Optimal Statistical
Rates." ICML 2018 (median, trimmed mean).
Blanchard, El Mhamdi, Guerraoui, Stainer. "Machine Learning with Adversaries: Byzantine Tolerant Gradient
Descent." NeurIPS 2017 (Krum, Multi-Krum).

All three ignore ``num_examples``: a client that lies about its data size gains no extra weight.
The math lives in :mod:`fedsim.strategy.functional`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedsim.core.checks import integer, within
from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import Strategy
from fedsim.strategy.functional import coordinate_median, krum_select, trim_count, trimmed_mean, weighted_average


def _stack(updates: Sequence[ClientUpdate]) -> torch.Tensor:
    if len(updates) == 0:
        raise ValueError("robust aggregation needs at least one update")
    return torch.stack([u.params for u in updates])


class Median(Strategy):
    """w ← the coordinate-wise median of the clients' weights (mean of the two middle values for even n)."""

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        return coordinate_median(_stack(updates))


class TrimmedMean(Strategy):
    """w ← per coordinate, the mean of the clients' values without the ⌊β·n⌋ largest and ⌊β·n⌋ smallest.

    Tolerates up to ⌊β·n⌋ arbitrary clients per round. ``beta`` in [0, 0.5); 0 is the unweighted mean.
    """

    def __init__(self, beta: float = 0.1) -> None:
        within("strategy.beta", beta, "[0, 0.5)")
        self.beta = beta

    def _require(self, n: int, what: str, fix: str) -> None:
        """Refuse ``n`` values per coordinate where β > 0 trims nothing (a silent plain mean) or none is kept."""
        k = trim_count(n, self.beta)
        if n - 2 * k < 1:
            raise ValueError(
                f"strategy=trimmed_mean with beta={self.beta} keeps no value of {n} {what}; lower strategy.beta"
            )
        if self.beta > 0 and k == 0:
            raise ValueError(
                f"strategy=trimmed_mean with beta={self.beta} trims floor(beta*{n}) = 0 of {n} {what}; "
                f"{fix}, or set strategy.beta=0 for the mean"
            )

    def check(self, clients_per_round: int) -> None:
        self._require(clients_per_round, "clients per round", "raise strategy.beta or clients_per_round")

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        # failed, rejected or dropped clients can leave fewer updates than check() was told: refuse, do not
        # quietly turn into the plain mean
        stack = _stack(updates)
        self._require(len(updates), "updates left in the round", "raise strategy.beta or min_success_fraction")
        return trimmed_mean(stack, self.beta)


class Krum(Strategy):
    """w ← the update with the best Krum score (m=1), or the unweighted mean of the m best (Multi-Krum).

    A score is the sum of squared distances to the n − f − 2 nearest other updates; it needs
    n ≥ 2f + 3 clients per round, and ``m ≤ n − f`` so that f attackers cannot be in the average. The
    m selected updates are averaged without example weights, as in Blanchard et al. Equal scores go to
    the lower client id (with n − f − 2 = 1 the two closest updates always tie), so the result does not
    depend on the order of ``updates``. After :meth:`aggregate`, ``selected_client_ids`` names the clients whose
    updates were kept (the server reports how many were malicious in an attacked run: ``attack/malicious_selected``).
    """

    def __init__(self, f: int = 1, m: int = 1) -> None:
        integer("strategy.f", f, 0)
        integer("strategy.m", m, 1)
        self.f, self.m = f, m
        self.selected_client_ids: list[int] | None = None
        self._received: list[int] = []

    def _require(self, n: int, where: str) -> None:
        if n < 2 * self.f + 3:
            raise ValueError(
                f"strategy=krum needs at least 2f+3 = {2 * self.f + 3} clients per round (f={self.f}) "
                f"but {where} {n}; lower strategy.f or raise clients_per_round"
            )
        if self.m > n - self.f:
            raise ValueError(
                f"strategy=krum needs m <= n - f = {n - self.f} (m={self.m}, f={self.f}) but {where} {n}; "
                "lower strategy.m or raise clients_per_round"
            )

    def check(self, clients_per_round: int) -> None:
        self._require(clients_per_round, "clients_per_round is")

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        self._require(len(updates), "the round has")
        ordered = sorted(updates, key=lambda u: u.client_id)  # ties and summation order by client id
        stack = _stack(ordered)
        chosen = sorted(krum_select(stack, self.f, self.m))
        self.selected_client_ids = [ordered[i].client_id for i in chosen]
        self._received = [u.client_id for u in ordered]
        return weighted_average([stack[i] for i in chosen], [1.0] * len(chosen))

    def client_metrics(self, round_num: int) -> dict[int, dict[str, float]]:
        """Each aggregated client's ``selected``: 1 if its update was kept, else 0 (TensorBoard:
        ``participants/strategy/selected``)."""
        kept = set(self.selected_client_ids or ())
        return {client_id: {"selected": float(client_id in kept)} for client_id in self._received}
