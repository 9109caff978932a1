"""Simulated stragglers (system heterogeneity), as in the FedProx paper.

Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith. "Federated Optimization in Heterogeneous Networks."
MLSys 2020, Section 5.2: in every round a fraction of the sampled devices are stragglers that manage
only a random number of local epochs. Stragglers are a property of the simulated system, so the
server decides them; a strategy only says whether it keeps their partial work
(``Strategy.keeps_stragglers``: FedAvg drops it, FedProx keeps it).

A client that trains ``local_steps`` K instead of epochs straggles in the same rounds (the same draw decides who)
and then does a uniformly random number of steps in 1..K − 1, the step-wise analogue of 1..E − 1 epochs
(``stragglers.epochs`` is then not read; with K = 1 nobody straggles).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsim.core.checks import integer, within


@dataclass(frozen=True)
class Stragglers:
    """Decides, as a pure function of ``(seed, round, client)``, who straggles and how many epochs it manages.

    ``fraction`` is each sampled client's chance of straggling in a round; ``epochs`` is the full
    number of local epochs E (a straggler does between 1 and E − 1).
    """

    fraction: float = 0.0
    epochs: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        within("stragglers.fraction", self.fraction, "[0, 1]")
        integer("stragglers.epochs", self.epochs, 1)

    def epochs_for(self, round_num: int, client_id: int) -> int | None:
        """The epochs a straggler manages this round, or ``None`` when the client is not a straggler."""
        return self.work_for(round_num, client_id, self.epochs)

    def work_for(self, round_num: int, client_id: int, full: int) -> int | None:
        """How many of its ``full`` units of work (epochs E, or local steps K) a straggler manages this round, uniformly
        in 1..full − 1, or ``None`` when the client does not straggle (nor ever with ``full`` < 2)."""
        if self.fraction == 0.0 or full < 2:
            return None
        rng = np.random.default_rng([self.seed, round_num, client_id, 0x57])
        if rng.random() >= self.fraction:
            return None
        return int(rng.integers(1, full))  # 1 .. full-1
