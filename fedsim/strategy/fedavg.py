"""FedAvg: the example-weighted mean of the clients' weights.

McMahan, Moore, Ramage, Hampson, Agüera y Arcas. "Communication-Efficient Learning of Deep Networks
from Decentralized Data." AISTATS 2017. Straggler handling as in the FedProx paper's FedAvg baseline
(Li et al., MLSys 2020): stragglers' partial work is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fedsim.strategy.base import Strategy
from fedsim.strategy.functional import weighted_average
from fedsim.strategy.stragglers import Stragglers
from fedsim.types import ClientUpdate


class FedAvg(Strategy):
    """w ← Σₖ (nₖ / n) wₖ over the clients that reported this round.

    With ``straggler_fraction > 0`` that share of sampled clients is told to do fewer than
    ``local_epochs`` epochs, and their updates are left out of the average (as FedAvg does in the
    FedProx paper). A round whose clients all straggled keeps the global model.
    """

    def __init__(self, *, straggler_fraction: float = 0.0, local_epochs: int = 1, seed: int = 0) -> None:
        self.stragglers = Stragglers(straggler_fraction, local_epochs, seed)

    def client_config(self, round_num: int, client_id: int) -> dict[str, Any]:
        epochs = self.stragglers.epochs_for(round_num, client_id)
        return {} if epochs is None else {"epochs": epochs}

    def aggregate(
        self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]
    ) -> torch.Tensor:
        kept = [u for u in updates if self.stragglers.epochs_for(round_num, u.client_id) is None]
        if not kept:
            return global_params
        return weighted_average([u.params for u in kept], [u.num_examples for u in kept])
