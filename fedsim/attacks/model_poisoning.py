"""Model-poisoning attacks: what a malicious client sends instead of its update Δ (trained − received weights).

* :class:`SignFlip`: −s·Δ, its own update reversed and scaled (the sign-flipping attack of Li, Xu, Chen, Giannakis
  and Ling, "RSA: Byzantine-Robust Stochastic Aggregation Methods for Distributed Learning from Heterogeneous
  Datasets", AAAI 2019).
* :class:`GaussianNoise`: a vector of N(0, σ²) values, independent of training (the Gaussian Byzantine workers of
  Blanchard, El Mhamdi, Guerraoui and Stainer, NeurIPS 2017).
* :class:`Scaling`: γ·Δ, its update boosted (model replacement, Bagdasaryan, Veit, Hua, Estrin and Shmatikov, "How To
  Backdoor Federated Learning", AISTATS 2020: γ ≈ n/η lets one client replace the global model).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from fedsim.attacks.base import Attack, client_generator
from fedsim.core.checks import number


class SignFlip(Attack):
    """Each malicious client sends −``scale``·Δ."""

    def __init__(self, *, scale: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scale = number("attack.scale", scale)

    def poison(
        self, deltas: Mapping[int, torch.Tensor], malicious: frozenset[int], seed: int, round_num: int
    ) -> dict[int, torch.Tensor]:
        return {c: deltas[c] * -self.scale for c in sorted(malicious & deltas.keys())}


class GaussianNoise(Attack):
    """Each malicious client sends N(0, ``std``²) values from its own generator (seed, round, client)."""

    def __init__(self, *, std: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.std = number("attack.std", std, at_least=0)

    def poison(
        self, deltas: Mapping[int, torch.Tensor], malicious: frozenset[int], seed: int, round_num: int
    ) -> dict[int, torch.Tensor]:
        return {
            c: torch.randn(deltas[c].shape, generator=client_generator(seed, round_num, c)) * self.std
            for c in sorted(malicious & deltas.keys())
        }


class Scaling(Attack):
    """Each malicious client sends ``boost``·Δ (model replacement with ``boost`` ≈ clients per round)."""

    def __init__(self, *, boost: float = 10.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.boost = number("attack.boost", boost)

    def poison(
        self, deltas: Mapping[int, torch.Tensor], malicious: frozenset[int], seed: int, round_num: int
    ) -> dict[int, torch.Tensor]:
        return {c: deltas[c] * self.boost for c in sorted(malicious & deltas.keys())}
