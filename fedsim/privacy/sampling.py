"""Poisson sampling of clients, the sampling the privacy accountant assumes (:mod:`fedsim.privacy.accountant`).

Every client takes part in a round independently with probability q = clients_per_round / num_clients, so the
cohort's size varies around ``clients_per_round`` (it can be empty; the round still adds its noise). The draw is a
pure function of (seed, round), like every sampling in fedsim.
"""

from __future__ import annotations

import numpy as np


def poisson_sample(rng: np.random.Generator, num_clients: int, rate: float) -> list[int]:
    """The clients that take part, ascending: each with probability ``rate``, independently."""
    return [int(c) for c in np.flatnonzero(rng.random(num_clients) < rate)]
