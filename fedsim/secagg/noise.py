"""The integer noise of distributed DP: the discrete Gaussian and the Skellam distribution, sampled from a client's
own stream (seed, round, client) so that the noise is the same bit for bit whoever computes it.

**Discrete Gaussian** N_Z(0, σ²): P(Y = y) ∝ exp(−y²/(2σ²)) on the integers. Sampled by the rejection sampler of
Canonne, Kamath, Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020, Algorithm 3: with
t = ⌊σ⌋ + 1, draw Y from the discrete Laplace P(Y = y) ∝ exp(−|y|/t) and accept it with probability
exp(−(|Y| − σ²/t)²/(2σ²)), else draw again. The discrete Laplace is their Algorithm 2's distribution, drawn as a
sign and a magnitude X ~ Geometric(1 − e^(−1/t)) on {0, 1, ...}, rejecting "−0".

*Which variant:* the algorithm's structure is CKS's, vectorized over the coordinates; its geometric draws and its
acceptance test use float64 uniforms (numpy), as TensorFlow Privacy's sampler does, not CKS's exact rational
arithmetic. The distribution is exact up to float64 rounding of the probabilities (relative error of order 2⁻⁵³);
a deployment that must resist floating-point attacks (Mironov, CCS 2012) wants the exact-arithmetic version.

**Skellam** Sk(λ, λ) = N₁ − N₂ with N₁, N₂ independent Poisson(λ): mean 0, variance 2λ, and a sum of independent
Skellams is a Skellam (Agarwal, Kairouz, Liu, "The Skellam Mechanism for Differentially Private Federated
Learning", NeurIPS 2021). A client that must add variance σ² draws λ = σ²/2 (numpy's Poisson sampler).
"""

from __future__ import annotations

import math

import numpy as np

from fedsim.secagg.seeds import NOISE, rng


def noise_generator(seed: int, round_num: int, client_id: int) -> np.random.Generator:
    """``client_id``'s noise stream in round ``round_num`` (its own: it does not depend on who else takes part)."""
    return rng(seed, NOISE, round_num, client_id)


def discrete_laplace(generator: np.random.Generator, scale: int, size: int) -> np.ndarray:
    """``size`` draws (int64) of P(y) ∝ exp(−|y|/``scale``): a sign and a geometric magnitude, "−0" rejected."""
    out = np.empty(size, dtype=np.int64)
    filled, p = 0, -math.expm1(-1.0 / scale)  # p = 1 − e^(−1/t): the magnitude's chance to stop at each step
    while filled < size:
        want = size - filled
        magnitude = generator.geometric(p, want).astype(np.int64) - 1  # numpy's geometric counts from 1
        negative = generator.random(want) < 0.5
        keep = ~(negative & (magnitude == 0))
        draws = np.where(negative, -magnitude, magnitude)[keep]
        out[filled : filled + draws.size] = draws
        filled += draws.size
    return out


def discrete_gaussian(generator: np.random.Generator, sigma: float, size: int) -> np.ndarray:
    """``size`` draws (int64) of the discrete Gaussian N_Z(0, ``sigma``²) (CKS20's Algorithm 3, see the module)."""
    if sigma <= 0:
        return np.zeros(size, dtype=np.int64)
    t = math.floor(sigma) + 1
    variance = sigma * sigma
    out = np.empty(size, dtype=np.int64)
    filled = 0
    while filled < size:
        y = discrete_laplace(generator, t, size - filled)
        accept = generator.random(y.size) < np.exp(-((np.abs(y) - variance / t) ** 2) / (2 * variance))
        kept = y[accept]
        out[filled : filled + kept.size] = kept
        filled += kept.size
    return out


def skellam(generator: np.random.Generator, variance: float, size: int) -> np.ndarray:
    """``size`` draws (int64) of the symmetric Skellam of this ``variance``: Poisson(σ²/2) − Poisson(σ²/2)."""
    if variance <= 0:
        return np.zeros(size, dtype=np.int64)
    lam = variance / 2
    return generator.poisson(lam, size).astype(np.int64) - generator.poisson(lam, size).astype(np.int64)
