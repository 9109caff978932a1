"""Omniscient model-poisoning attacks, which read the round's honest updates (in client-id order: deterministic).

* :class:`ALittleIsEnough` (Baruch, Baruch and Goldberg, "A Little Is Enough: Circumventing Defenses For
  Distributed Learning", NeurIPS 2019): every malicious client sends μ − z·σ, with μ and σ the coordinate-wise mean
  and standard deviation of the round's updates and z the paper's z_max: with n updates and m malicious among them,
  s = ⌊n/2 + 1⌋ − m supporters are needed, and z_max = Φ⁻¹((n − s)/n) (so that the crafted value stays closer to the
  mean than enough honest values for median- and Krum-style rules to keep it). ``z`` fixed instead when given.
* :class:`InnerProductManipulation` (Xie, Koyejo and Gupta, "Fall of Empires: Breaking Byzantine-tolerant SGD by
  Inner Product Manipulation", UAI 2020): every malicious client sends −ε·μ, ε > 0, so the aggregate's inner
  product with the true mean update turns negative once the malicious clients weigh enough.

Here "the round's updates" are all the updates that came back, the malicious clients' own honest ones included (the
papers' attackers know the honest gradients; with their own honest results included, the statistics are those of
n honest draws).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from statistics import NormalDist
from typing import Any

import torch

from fedsim.attacks.base import Attack
from fedsim.core.checks import number


def _stacked(deltas: Mapping[int, torch.Tensor]) -> torch.Tensor:
    return torch.stack([deltas[c].double() for c in sorted(deltas)])


def alie_z(n: int, m: int) -> float:
    """ALIE's z_max for n updates of which m are malicious (0 when no honest majority is left to mimic)."""
    supporters = math.floor(n / 2 + 1) - m
    share = (n - supporters) / n
    return NormalDist().inv_cdf(share) if 0 < share < 1 else 0.0


class ALittleIsEnough(Attack):
    """μ − z·σ for every malicious client (``z``: None for the paper's z_max)."""

    def __init__(self, *, z: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.z = None if z is None else number("attack.z", z)

    def poison(
        self, deltas: Mapping[int, torch.Tensor], malicious: frozenset[int], seed: int, round_num: int
    ) -> dict[int, torch.Tensor]:
        attackers = sorted(malicious & deltas.keys())
        if not attackers:
            return {}
        stack = _stacked(deltas)
        z = self.z if self.z is not None else alie_z(len(deltas), len(attackers))
        sigma = stack.std(dim=0, unbiased=False) if len(deltas) > 1 else torch.zeros_like(stack[0])
        crafted = (stack.mean(dim=0) - z * sigma).to(deltas[attackers[0]].dtype)
        return {c: crafted.clone() for c in attackers}


class InnerProductManipulation(Attack):
    """−``epsilon``·μ for every malicious client."""

    def __init__(self, *, epsilon: float = 0.5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.epsilon = number("attack.epsilon", epsilon, above=0)

    def poison(
        self, deltas: Mapping[int, torch.Tensor], malicious: frozenset[int], seed: int, round_num: int
    ) -> dict[int, torch.Tensor]:
        attackers = sorted(malicious & deltas.keys())
        if not attackers:
            return {}
        crafted = (_stacked(deltas).mean(dim=0) * -self.epsilon).to(deltas[attackers[0]].dtype)
        return {c: crafted.clone() for c in attackers}
