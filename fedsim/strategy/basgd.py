"""BASGD: buffered asynchronous aggregation that resists Byzantine clients.

Yang and Li. "BASGD: Buffered Asynchronous SGD for Byzantine Learning." ICML 2021 (extended in JMLR 24, 2023),
Algorithm 1, in FedBuff's setting: clients send model updates Δ (trained − start weights) instead of gradients,
and the server steps with ``+ server_lr ·`` the aggregate instead of ``− lr ·``. The server keeps ``num_buffers``
(B) buffers. An update from client c goes to buffer c mod B, which holds the mean of the updates it received since
the last server step. Once every buffer holds at least one update, the server steps with a robust aggregate of the
B buffer means and empties the buffers:

    w ← w + η_g · Aggr(h_1, ..., h_B),    h_b = mean of s(τ) Δ over the updates in buffer b

``rule``: ``median`` (coordinate-wise, the mean of the two middle values for even B) or ``trimmed_mean``
(coordinate-wise, without the ⌊β·B⌋ largest and smallest, ``trim`` = β). A malicious client corrupts only its
own buffer's mean, so fewer than B/2 corrupted buffers (median), or at most ⌊β·B⌋ (trimmed mean), cannot move a
coordinate outside the range of the honest buffers' means. The paper's workers send gradients without a staleness
weight, hence ``staleness_exponent=0`` by default; FedBuff's s(τ) = (1 + τ)^-exponent is available.

The event loop (:mod:`fedsim.server.buffered`) is FedBuff's: a server step waits until :meth:`BASGD.buffer_full`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedsim.core.checks import within
from fedsim.strategy.fedbuff import FedBuff
from fedsim.strategy.functional import coordinate_median, trimmed_mean

RULES = ("median", "trimmed_mean")


class BASGD(FedBuff):
    """FedBuff's asynchronous loop with BASGD's buffers and robust step (see the module docstring)."""

    buffer_setting = "num_buffers"

    def __init__(
        self,
        num_buffers: int = 5,
        concurrency: int = 20,
        server_lr: float = 1.0,
        staleness_exponent: float = 0.0,
        rule: str = "median",
        trim: float = 0.2,
    ) -> None:
        super().__init__(
            buffer_size=num_buffers, concurrency=concurrency, server_lr=server_lr, staleness_exponent=staleness_exponent
        )
        if rule not in RULES:
            raise ValueError(f"strategy.rule must be one of {', '.join(RULES)} (got {rule!r})")
        self.num_buffers, self.rule, self.trim = int(num_buffers), rule, within("strategy.trim", trim, "[0, 0.5)")

    def buffer_full(self, client_ids: Sequence[int]) -> bool:
        """Every one of the B buffers holds at least one update."""
        return len({c % self.num_buffers for c in client_ids}) == self.num_buffers

    def step(
        self,
        global_params: torch.Tensor,
        deltas: Sequence[torch.Tensor],
        staleness: Sequence[int],
        client_ids: Sequence[int] = (),
    ) -> torch.Tensor:
        """``w + server_lr · Aggr(buffer means)``, each mean summed in float64 in arrival order. Buffers left empty
        (their updates rejected by the server's checks) are left out; with none left the model stays."""
        sums: dict[int, torch.Tensor] = {}
        counts: dict[int, int] = {}
        for delta, tau, client in zip(deltas, staleness, client_ids, strict=True):
            b = client % self.num_buffers
            weighted = delta.double() * self.staleness_weight(tau)
            sums[b] = sums[b] + weighted if b in sums else weighted
            counts[b] = counts.get(b, 0) + 1
        if not sums:
            return global_params
        means = torch.stack([sums[b] / counts[b] for b in sorted(sums)])
        aggregate = coordinate_median(means) if self.rule == "median" else trimmed_mean(means, self.trim)
        return (global_params.double() + self.server_lr * aggregate.double()).to(global_params.dtype)
