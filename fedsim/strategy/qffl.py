"""q-FFL solved by q-FedAvg: clients with a higher loss get a larger say, for a more uniform accuracy across clients.

Li, Sanjabi, Beirami, Smith. "Fair Resource Allocation in Federated Learning." ICLR 2020 (Algorithm 2, q-FedAvg).
The objective is f_q(w) = Σ_k p_k F_k(w)^{q+1} / (q + 1); q = 0 is FedAvg's objective, a larger q weighs the
clients with a high loss more. Each sampled client k measures F_k(w^t), the loss of the global model on its own
training data, before any local step (the client half :class:`StartLoss`), then trains as usual to w_k. With L
the Lipschitz estimate (the paper uses L = 1/η, η the local learning rate), the server computes, in float64 and
client-id order:

    Δw_k = L (w^t − w_k)
    Δ_k  = F_k^q Δw_k
    h_k  = q F_k^{q−1} ‖Δw_k‖² + L F_k^q
    w^{t+1} = w^t − Σ_k Δ_k / Σ_k h_k

With q = 0, Δ_k = L (w^t − w_k) and h_k = L, so w^{t+1} = w^t − Σ_k (w^t − w_k) / m: the unweighted mean of the
m client models (uniform FedAvg; the paper's FedAvg baseline, whose p_k enter through the sampling below). That
holds when every client has the same L (``lipschitz`` given, or every client training with the same learning
rate); with per-client learning rates each client model is weighted by its own L_k = 1/η_k.

Choices made here:

* ``lipschitz=None`` takes L_k = 1 / ``update.metrics["lr"]`` per client (the learning rate that
  :meth:`fedsim.client.base.Client.fit` reports), as the paper's code does; a number uses that L for every client.
* A zero start loss follows the formula wherever it is defined, with 0^0 = 1 as in the paper: with q = 1 the
  term is q F_k^0 ‖Δw_k‖² = ‖Δw_k‖² (kept: such a client adds to Σ h_k though its Δ_k = 0 Δw_k = 0), with q > 1
  it is 0. With 0 < q < 1, F^{q−1} would be infinite; the term is then taken as 0: it estimates q F^{q−1} ‖∇F‖²,
  and for a non-negative L-smooth loss ‖∇F‖² ≤ 2 L F, so the term is at most 2 q L F^q, which goes to 0 with F
  (and Δ_k = 0^q Δw_k = 0 as well: such a client has nothing to correct). With q = 0 that term is 0 for every
  client, whatever its loss. The paper's code adds 1e-10 to every loss instead; here the rule stays exact. If
  every start loss is 0 (q > 0), Σ_k Δ_k = 0 and the model stays w^t (also when Σ h_k = 0).
* ``sampling="weighted"`` (the default) samples the round's clients with probability proportional to their
  number of training examples, without replacement, as Algorithm 2 and the paper's code do (that is where
  the p_k of f_q enter); ``"uniform"`` uses fedsim's uniform sampling (then q = 0 treats every client alike).
* Stragglers are kept: the rule is defined for any amount of local work (a shorter Δw_k just counts less in h_k).

The client half measures the model outside the local epochs (``before_training``), which ``executor=vmap``
cannot vectorise: it refuses this strategy at start-up; use ``executor=process``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedsim.core.checks import number
from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import LocalTraining, Strategy
from fedsim.strategy.context import RunContext

if TYPE_CHECKING:
    from fedsim.client.task_trainer import TaskTrainer

START_LOSS = "qffl_start_loss"
"""The update metric holding F_k(w^t): the global model's mean loss on the client's training data."""

SAMPLING = ("weighted", "uniform")


class StartLoss(LocalTraining):
    """Client half: record F_k(w^t), the loss of the global weights on the client's training data, before the
    local epochs (no training, no random draw), as the update's ``qffl_start_loss`` metric."""

    def before_training(self, trainer: TaskTrainer, state: dict[str, Any]) -> None:
        trainer.metrics[START_LOSS] = trainer.data_loss()


def start_loss(update: ClientUpdate) -> float:
    """F_k of one update; a finite number >= 0."""
    try:
        loss = float(update.metrics[START_LOSS])
    except KeyError:
        raise ValueError(
            f"QFFL needs the metric '{START_LOSS}' in every update (client {update.client_id} has none; the "
            "strategy's client half StartLoss reports it: a custom fit must run it)"
        ) from None
    if not (loss >= 0 and math.isfinite(loss)):
        raise ValueError(f"QFFL needs a finite {START_LOSS} >= 0 (client {update.client_id} reported {loss})")
    return loss


def lipschitz_of(update: ClientUpdate, lipschitz: float | None) -> float:
    """L for one update: ``lipschitz`` if given, else 1 / the learning rate the client reported."""
    if lipschitz is not None:
        return lipschitz
    try:
        lr = float(update.metrics["lr"])
    except KeyError:
        raise ValueError(
            f"QFFL needs the metric 'lr' in every update when strategy.lipschitz is null (client {update.client_id} "
            "has none; fedsim.Client.fit reports it)"
        ) from None
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"QFFL needs lr > 0 to take L = 1/lr (client {update.client_id} reported {lr})")
    return 1.0 / lr


def q_fedavg(
    global_params: torch.Tensor,
    params: Sequence[torch.Tensor],
    losses: Sequence[float],
    lipschitz: Sequence[float],
    q: float,
) -> torch.Tensor:
    """w^t − Σ_k Δ_k / Σ_k h_k (float64, folded in the given order, cast back to ``global_params``' dtype); the
    zero-loss rule of the module docstring; w^t itself when Σ_k h_k = 0."""
    start = global_params.double()
    deltas = torch.zeros_like(start)
    h_total = 0.0
    for w_k, loss, lip in zip(params, losses, lipschitz, strict=True):
        dw = (start - w_k.double()) * lip
        weight = loss**q  # 0.0 ** 0 is 1.0: q = 0 weighs every client alike
        h_total += lip * weight
        if q > 0 and (loss > 0 or q >= 1):  # q F^{q-1} ‖Δw‖²: 0 when q = 0; 0^0 = 1; 0 when F = 0 and q < 1
            h_total += q * loss ** (q - 1) * float(dw.square().sum())
        deltas.add_(dw, alpha=weight)
    if h_total == 0:
        return global_params.clone()
    return (start - deltas / h_total).to(global_params.dtype)


class QFFL(Strategy):
    """q-FedAvg: w ← w − Σ_k F_k^q L (w − w_k) / Σ_k (q F_k^{q−1} ‖L (w − w_k)‖² + L F_k^q); see the module."""

    keeps_stragglers = True

    def __init__(self, *, q: float = 1.0, lipschitz: float | None = None, sampling: str = "weighted") -> None:
        number("strategy.q", q, at_least=0)
        if lipschitz is not None and (isinstance(lipschitz, bool) or not (lipschitz > 0 and math.isfinite(lipschitz))):
            raise ValueError(f"strategy.lipschitz must be > 0, or null for 1/lr (got {lipschitz})")
        if sampling not in SAMPLING:
            raise ValueError(f"strategy.sampling must be one of {', '.join(SAMPLING)} (got {sampling!r})")
        self.q = float(q)
        self.lipschitz = None if lipschitz is None else float(lipschitz)
        self.sampling = sampling
        self._num_examples: np.ndarray | None = None
        self._losses: list[float] = []  # the start losses of the round last aggregated

    def setup(self, context: RunContext) -> None:
        self._num_examples = np.asarray(context.num_examples, dtype=np.float64)
        holding = int(np.count_nonzero(self._num_examples))
        if self.sampling == "weighted" and holding < context.clients_per_round:
            raise ValueError(
                f"strategy.sampling=weighted needs at least clients_per_round={context.clients_per_round} clients "
                f"with training examples (got {holding}); use strategy.sampling=uniform"
            )

    def local_training(self) -> LocalTraining:
        return StartLoss()

    def sample(self, round_num: int, num_clients: int, clients_per_round: int, rng: np.random.Generator) -> list[int]:
        """Uniform, or (``weighted``) with probability proportional to the clients' training examples, without
        replacement; a pure function of ``rng`` (seeded from the seed and the round)."""
        if self.sampling == "uniform":
            return super().sample(round_num, num_clients, clients_per_round, rng)
        if self._num_examples is None or len(self._num_examples) != num_clients:
            raise RuntimeError("QFFL.sample with sampling=weighted needs setup() with the run's clients first")
        p = self._num_examples / self._num_examples.sum()
        chosen = rng.choice(num_clients, size=clients_per_round, replace=False, p=p)
        return sorted(int(c) for c in chosen)

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        losses = [start_loss(u) for u in updates]  # every update checked before anything changes
        lipschitz = [lipschitz_of(u, self.lipschitz) for u in updates]
        new = q_fedavg(global_params, [u.params for u in updates], losses, lipschitz, self.q)
        self._losses = losses
        return new

    def round_metrics(self, round_num: int) -> dict[str, float]:
        """``start_loss_mean`` and ``start_loss_max``: the unweighted mean and the largest F_k(w^t) over the round's
        clients (the global model's loss on their training data, before local training)."""
        if not self._losses:
            return {}
        return {"start_loss_mean": sum(self._losses) / len(self._losses), "start_loss_max": max(self._losses)}
