"""Adversarial clients: who is malicious, and the attack's interface.

A run's malicious clients are drawn from the seed: a fixed set for the whole run (``per_round=false``, the usual
threat model) or a fresh draw every round, ``fraction`` of the clients (rounded to the nearest integer; at least one
when ``fraction`` > 0). Their identity is recorded (``malicious.json`` in the run directory, and ``malicious`` in
each client's row of ``metrics.jsonl``) and counted in ``attack/`` metrics, but never shown to the strategy: the
updates it aggregates carry nothing that tells them apart.

A *model-poisoning* attack replaces each malicious client's update after local training, as the client would before
sending it (before any compression): :meth:`Attack.poison` gets the round's trained updates of every client and
returns the malicious ones' replacements. Omniscient attacks (ALIE, IPM) read the round's other updates, all of them
honest results of local training (the malicious clients' own included), in client-id order, so the result is the
same under every executor. Randomness comes from a generator seeded by (seed, round, client). Under FedBuff the
"round" is the server step and its updates are the step's buffer
(:meth:`fedsim.attacks.stage.AttackStage.apply_buffer`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import numpy as np
import torch

from fedsim.core.checks import within
from fedsim.core.seeding import attack_rng


class Attack(ABC):
    """``fraction`` of the clients are malicious, drawn once (``per_round=False``) or every round."""

    def __init__(self, *, fraction: float = 0.2, per_round: bool = False) -> None:
        within("attack.fraction", fraction, "[0, 1]")
        if not isinstance(per_round, bool):
            raise ValueError(f"attack.per_round must be true or false (got {per_round!r})")
        self.fraction, self.per_round = float(fraction), per_round

    def malicious(self, seed: int, round_num: int, num_clients: int) -> frozenset[int]:
        """The malicious clients of ``round_num``: a pure function of the seed (and the round with ``per_round``)."""
        count = min(num_clients, max(1 if self.fraction > 0 else 0, int(np.rint(self.fraction * num_clients))))
        rng = attack_rng(seed, round_num if self.per_round else 0)
        return frozenset(int(c) for c in rng.choice(num_clients, size=count, replace=False))

    @abstractmethod
    def poison(
        self, deltas: Mapping[int, torch.Tensor], malicious: frozenset[int], seed: int, round_num: int
    ) -> dict[int, torch.Tensor]:
        """The deltas (trained − received weights) the malicious clients among ``deltas`` send instead, by client
        id; ``deltas`` holds every client of the round that returned an update, honest results of training."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(fraction={self.fraction}, per_round={self.per_round})"


def client_generator(seed: int, round_num: int, client_id: int) -> torch.Generator:
    """The generator of one malicious client's draws in one round."""
    from fedsim.core.seeding import attack_seed

    return torch.Generator().manual_seed(attack_seed(seed, round_num, client_id))
