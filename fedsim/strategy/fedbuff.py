"""FedBuff: asynchronous FL with a buffer of client updates and a staleness weighting.

Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek, Huba. "Federated Learning with Buffered Asynchronous
Aggregation." AISTATS 2022, Algorithm 1. Up to ``concurrency`` clients train at once, each from the global model
as it was when it started. When a client finishes, its update Δ = (its weights − the weights it started from),
scaled by the staleness weight s(τ) = (1 + τ)^(-1/2), is added to a buffer, where τ is how many server updates
happened while it trained. Once ``buffer_size`` (K) updates are in the buffer, the server steps:

    w ← w + η_g · (1/K) Σ_k s(τ_k) Δ_k

and a new client starts whenever one finishes, so ``concurrency`` keep training. ``buffer_size=1`` is plain
asynchronous FedAvg, one server step per client update (the paper's FedAsync-style baseline, without mixing).

The event loop (who trains when, in what order the updates arrive) runs on fedsim's simulated clock
(:mod:`fedsim.server.buffered`), so it is deterministic. One server step is one "round" of fedsim's metrics and
checkpoints. ``staleness_exponent`` generalises the paper's 1/2 (0: no staleness weighting).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import Strategy


class FedBuff(Strategy):
    """Buffered asynchronous aggregation (see the module docstring). A fedsim round is one server step."""

    asynchronous = True
    keeps_stragglers = True
    buffer_setting = "buffer_size"  # the setting that bounds the updates a step waits for (in error messages)

    def __init__(
        self, buffer_size: int = 10, concurrency: int = 20, server_lr: float = 1.0, staleness_exponent: float = 0.5
    ) -> None:
        if buffer_size < 1 or concurrency < 1:
            raise ValueError(
                f"strategy.buffer_size and strategy.concurrency must be >= 1 (got {buffer_size}, {concurrency})"
            )
        if not server_lr > 0 or not staleness_exponent >= 0:
            raise ValueError(
                f"strategy.server_lr must be > 0 and strategy.staleness_exponent >= 0 "
                f"(got {server_lr}, {staleness_exponent})"
            )
        self.buffer_size, self.concurrency = int(buffer_size), int(concurrency)
        self.server_lr, self.staleness_exponent = float(server_lr), float(staleness_exponent)

    def staleness_weight(self, staleness: int) -> float:
        """s(τ) = (1 + τ)^(-staleness_exponent)."""
        return float((1.0 + staleness) ** -self.staleness_exponent)

    def buffer_full(self, client_ids: Sequence[int]) -> bool:
        """Whether the updates that arrived since the last server step (their clients, in arrival order) make a
        step: ``buffer_size`` of them. A subclass may ask for something else (:class:`fedsim.strategy.BASGD`)."""
        return len(client_ids) >= self.buffer_size

    def step(
        self,
        global_params: torch.Tensor,
        deltas: Sequence[torch.Tensor],
        staleness: Sequence[int],
        client_ids: Sequence[int] = (),
    ) -> torch.Tensor:
        """One server step from a full buffer: ``w + server_lr · mean_k s(τ_k) Δ_k``, summed in float64 in arrival
        order (the event order, which is deterministic). ``client_ids``: whose updates they are, in the same order
        (FedBuff does not need them)."""
        total = torch.zeros_like(global_params, dtype=torch.float64)
        for delta, tau in zip(deltas, staleness, strict=True):
            total.add_(delta.double(), alpha=self.staleness_weight(tau))
        return (global_params.double() + self.server_lr * total / len(deltas)).to(global_params.dtype)

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        raise RuntimeError(
            "FedBuff aggregates asynchronously (fedsim.server.buffered); the synchronous round does not call it"
        )
