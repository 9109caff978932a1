"""Central DP in the round loop: who is sampled, what the strategy aggregates, the ledger and the budget.

The server asks :class:`PrivateRounds` for the round's clients (Poisson sampling), hands it the round's sound
updates and gets back the one noisy mean update the strategy aggregates (even when no client took part: the noise
is still added and the round still counts), and asks it after every round whether the next one would exceed
``dp.epsilon_max``, which stops the run cleanly before that round (checkpoint, ``stop_reason``).

``dp.delta`` must be below 1/N for N clients, and is best far below it: a mechanism that publishes each client's
data outright with probability δ (and nothing else) meets (0, δ)-DP at the client level and reveals δ·N clients'
data on average, so with δ >= 1/N the ε reported means nothing (Dwork and Roth, "The Algorithmic Foundations of
Differential Privacy", 2014, §2.3: δ of the order of 1/N is very dangerous). δ >= 1/N is refused; δ in
[1/(10·N), 1/N) runs, with a warning.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fedsim.core.types import ClientUpdate
from fedsim.privacy.accountant import PrivacyLedger
from fedsim.privacy.central import CentralDP
from fedsim.privacy.sampling import poisson_sample
from fedsim.strategy.base import Strategy

log = logging.getLogger("fedsim")


def check_delta(delta: float, num_clients: int, key: str = "dp.delta") -> None:
    """Refuse, in one line naming ``key``, a δ of at least 1/``num_clients``; warn when it is above
    1/(10·num_clients) (see the module docstring)."""
    suggestion = min(1e-5, 10.0 ** math.floor(math.log10(0.1 / num_clients)))
    if delta >= 1 / num_clients:
        raise ValueError(
            f"{key}={delta:g} must be below 1/{num_clients} = {1 / num_clients:.3g}, one over the run's "
            f"{num_clients} clients (with δ >= 1/n a mechanism may publish a client's data outright and ε means "
            f"nothing); use e.g. {key}={suggestion:g}"
        )
    if delta >= 0.1 / num_clients:
        log.warning(
            "%s=%g is close to 1/%d = %.3g (the run's %d clients): the guarantee allows revealing %.2g "
            "clients' data outright on average (δ·n); keep it below 1/(10·n) = %.3g, e.g. %s=%g",
            key,
            delta,
            num_clients,
            1 / num_clients,
            num_clients,
            delta * num_clients,
            0.1 / num_clients,
            key,
            suggestion,
        )


def check_strategy(strategy: Strategy) -> None:
    """Refuse, in one line, an asynchronous strategy (its server steps are not DP-FedAvg's rounds) or one that samples
    its own way. (A strategy that reads the individual updates is refused by the round's declarations: DP's noisy
    mean passes only the aggregate on; :mod:`fedsim.server.stage`.)"""
    if getattr(strategy, "asynchronous", False):
        raise ValueError(
            f"dp=central: {type(strategy).__name__} is asynchronous, and DP-FedAvg's accounting is per synchronous "
            "round; use strategy=fedavg, fedprox, fedavgm, fedadam, fedyogi or fedadagrad"
        )
    if type(strategy).sample is not Strategy.sample:
        raise ValueError(
            f"dp=central samples clients by Poisson sampling (what the accountant assumes); "
            f"{type(strategy).__name__} samples its own way"
        )


def private_rounds(
    dp: CentralDP | None, strategy: Strategy, clock: object | None, num_clients: int, clients_per_round: int, seed: int
) -> PrivateRounds | None:
    """The run's :class:`PrivateRounds` (None without ``dp``), once what it cannot run is refused in one line."""
    if dp is None:
        return None
    check_strategy(strategy)
    if clock is not None:
        raise ValueError(
            "dp=central samples every client with the same probability; the simulated clock samples only "
            "online clients, which the accountant does not model: use clock=none"
        )
    return PrivateRounds(dp, num_clients=num_clients, clients_per_round=clients_per_round, seed=seed)


class PrivateRounds:
    """DP-FedAvg over a run: ``dp`` settings, N clients, ``clients_per_round`` expected per round."""

    def __init__(self, dp: CentralDP, *, num_clients: int, clients_per_round: int, seed: int) -> None:
        check_delta(dp.delta, num_clients)
        self.dp, self.seed = dp, seed
        self.rate = clients_per_round / num_clients
        self.expected = float(clients_per_round)
        dp.update_multiplier(self.expected)  # refuses a count noise too small for the noise multiplier
        self.clip_norm = dp.clip_norm
        self.ledger = PrivacyLedger(self.rate, dp.noise_multiplier, dp.delta, accountant=dp.accountant)
        first = self.ledger.epsilon(1)
        if dp.epsilon_max is not None and first > dp.epsilon_max:
            raise ValueError(
                f"dp.epsilon_max={dp.epsilon_max} is below ε={first:.4g} of a single round (q={self.rate:.4g}, "
                f"z={dp.noise_multiplier}, δ={dp.delta}, dp.accountant={dp.accountant}); raise it, or the noise "
                "multiplier"
            )

    def sample(self, rng: np.random.Generator, num_clients: int) -> list[int]:
        return poisson_sample(rng, num_clients, self.rate)

    def aggregate_input(
        self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]
    ) -> tuple[list[ClientUpdate], dict[str, float]]:
        """The one update the strategy aggregates (global + noisy mean update) and the round's ``dp/`` metrics; the
        ledger records the round and the clip norm moves on (adaptive clipping)."""
        mean, metrics, self.clip_norm = self.dp.noisy_mean(
            self.seed, round_num, global_params, [u.params for u in updates], self.expected, self.clip_norm
        )
        noisy = ClientUpdate(client_id=-1, round_num=round_num, params=global_params + mean, num_examples=1)
        metrics["dp/epsilon"] = self.ledger.record()
        metrics["dp/delta"] = self.dp.delta
        return [noisy], metrics

    def stop_reason(self, next_round: int) -> str | None:
        """Why the run must stop before ``next_round`` (it would exceed ``dp.epsilon_max``), or None."""
        if self.dp.epsilon_max is None:
            return None
        after = self.ledger.epsilon(self.ledger.rounds + 1)
        if after <= self.dp.epsilon_max:
            return None
        return (
            f"privacy budget: round {next_round} would bring ε to {after:.4g} > dp.epsilon_max={self.dp.epsilon_max} "
            f"(ε={self.ledger.epsilon():.4g} after {self.ledger.rounds} rounds, δ={self.dp.delta})"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"clip_norm": self.clip_norm, "ledger": self.ledger.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.clip_norm = float(state["clip_norm"])
        self.ledger.load_state_dict(state["ledger"])
