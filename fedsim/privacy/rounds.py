"""Central DP in the round loop: who is sampled, what the strategy aggregates, the ledger and the budget.

The server asks :class:`PrivateRounds` for the round's clients (Poisson sampling), hands it the round's sound
updates and gets back the one noisy mean update the strategy aggregates (even when no client took part: the noise
is still added and the round still counts), and asks it after every round whether the next one would exceed
``dp.epsilon_max``, which stops the run cleanly before that round (checkpoint, ``stop_reason``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fedsim.core.types import ClientUpdate
from fedsim.privacy.accountant import PrivacyLedger
from fedsim.privacy.central import CentralDP
from fedsim.privacy.sampling import poisson_sample
from fedsim.strategy.base import Strategy

MEAN_OF_UPDATES = ("FedAvg", "FedProx", "FedOpt")  # strategies whose server step is a function of the mean update


def check_strategy(strategy: Strategy) -> None:
    """Refuse, in one line, a strategy that aggregates more than the mean update (what the noise protects)."""
    names = {c.__name__ for c in type(strategy).__mro__}
    if not names & set(MEAN_OF_UPDATES) or getattr(strategy, "asynchronous", False):
        raise ValueError(
            f"dp=central: {type(strategy).__name__} aggregates per-client information that DP-FedAvg's noisy sum "
            "does not cover; use strategy=fedavg, fedprox, fedavgm, fedadam, fedyogi or fedadagrad"
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
        self.dp, self.seed = dp, seed
        self.rate = clients_per_round / num_clients
        self.expected = float(clients_per_round)
        dp.update_multiplier(self.expected)  # refuses a count noise too small for the noise multiplier
        self.clip_norm = dp.clip_norm
        self.ledger = PrivacyLedger(self.rate, dp.noise_multiplier, dp.delta)
        first = self.ledger.epsilon(1)
        if dp.epsilon_max is not None and first > dp.epsilon_max:
            raise ValueError(
                f"dp.epsilon_max={dp.epsilon_max} is below ε={first:.4g} of a single round (q={self.rate:.4g}, "
                f"z={dp.noise_multiplier}, δ={dp.delta}); raise it, or the noise multiplier"
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
