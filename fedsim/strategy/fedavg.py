"""FedAvg: the example-weighted mean of the clients' weights.

McMahan, Moore, Ramage, Hampson, Agüera y Arcas. "Communication-Efficient Learning of Deep Networks
from Decentralized Data." AISTATS 2017. As in the FedProx paper's baseline, stragglers' partial work
is dropped (``keeps_stragglers = False``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import Strategy
from fedsim.strategy.functional import weighted_average


class FedAvg(Strategy):
    """w ← Σₖ (nₖ / n) wₖ over the clients that reported this round."""

    keeps_stragglers = False
    needs = frozenset()  # a function of the mean update alone (runs under central DP and secure aggregation)

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        return weighted_average([u.params for u in updates], [u.num_examples for u in updates])
