"""The privacy of one round of distributed DP, as Rényi DP curves from the papers' bounds, and their conversion to
(ε, δ). All quantities are in the integer units the clients send (after scaling by s): a client's rounded vector q
has ‖q‖₂ ≤ Δ₂ and ‖q‖₁ ≤ Δ₁, and each of the m clients whose input reached the sum added noise of variance σ².

**Sensitivity after rounding** (Kairouz, Liu, Steinke, "The Distributed Discrete Gaussian Mechanism for Federated
Learning with Secure Aggregation", ICML 2021, conditional randomized rounding): a vector of L2 norm at most ℓ = s·c
in d' coordinates, stochastically rounded, has ‖q‖₂ ≤ ℓ + √d' always (every coordinate moves by less than 1); with
probability at least 1 − β, also ‖q‖₂² ≤ ℓ² + d'/4 + √(2 ln(1/β))·(ℓ + √d'/2), and conditional rounding re-rounds
until that holds. So Δ₂ = min(ℓ + √d', √(ℓ² + d'/4 + √(2 ln(1/β))·(ℓ + √d'/2))) (β = 0: the first term), and, for
integer vectors, Δ₁ = Δ₂·min(√d', Δ₂) (‖q‖₁ ≤ √d'‖q‖₂, and ‖q‖₁ ≤ ‖q‖₂² when every nonzero |qᵢ| ≥ 1).

**Distributed discrete Gaussian** (ibid., the RDP of the sum of m independent N_Z(0, σ²) per coordinate, their
Proposition 14 / Eq. 17 with Theorem 1's τ): with τ = 10·Σ_{k=1}^{m−1} exp(−2π²σ²·k/(k+1)) (the price of a sum of
discrete Gaussians not being a discrete Gaussian), a₂ = Δ₂/(√m·σ), a₁ = Δ₁/(√m·σ), at order α:

    ε(α) = min( α/2·a₂² + τ·d',  α/2·(a₂² + 2·a₁·τ + τ²·d'),  α/2·(a₂ + τ·√d')² ),

for σ ≥ 1/2, the bound's condition (below it the round is charged ε = ∞).

**Distributed Skellam** (Agarwal, Kairouz, Liu, "The Skellam Mechanism for Differentially Private Federated
Learning", NeurIPS 2021, the multidimensional Skellam mechanism's RDP): the sum of the clients' Skellam noise is a
Skellam of variance V = m·σ², and at order α

    ε(α) = α·Δ₂²/(2V) + min( ((2α − 1)·Δ₂² + 6·Δ₁)/(4V²),  3·Δ₁/(2V) ).

(The paper writes it for Sk(μ, μ), of variance 2μ: α·Δ₂²/(4μ) + min(((2α − 1)Δ₂² + 6Δ₁)/(16μ²), 3Δ₁/(4μ)).)

Both are for one release of the sum, neighbouring inputs differing in one client's vector (replaced by zero: the
sum moves by at most Δ₂ in L2 and Δ₁ in L1). Rounds compose by adding the curves. The orders are the authors'
accounting grid (integers 2 to 128, and 256), and (ε, δ) is Google's ``dp-accounting`` conversion
(``compute_epsilon``: Canonne, Kamath, Steinke 2020, Proposition 12), the one fedsim's central DP uses.
"""

from __future__ import annotations

import math

import numpy as np

ORDERS: tuple[int, ...] = (*range(2, 129), 256)
"""The Rényi orders of every curve: the distributed-DP authors' grid (google-research/federated, distributed_dp)."""


def rounded_l2_bound(levels: float, dim: int, beta: float) -> float:
    """Δ₂ of a vector of norm at most ``levels`` (ℓ = s·c) in ``dim`` coordinates after (conditional, when
    ``beta`` > 0) stochastic rounding: the module docstring's formula."""
    loose = levels + math.sqrt(dim)
    if beta == 0:
        return loose
    tight = levels**2 + dim / 4 + math.sqrt(2 * math.log(1 / beta)) * (levels + math.sqrt(dim) / 2)
    return min(loose, math.sqrt(tight))


def rounded_l1_bound(l2: float, dim: int) -> float:
    """Δ₁ of an integer vector of L2 norm at most ``l2`` in ``dim`` coordinates: l2·min(√dim, l2)."""
    return l2 * min(math.sqrt(dim), l2)


def ddg_tau(sigma: float, clients: int) -> float:
    """τ = 10·Σ_{k=1}^{m−1} exp(−2π²σ²·k/(k+1)) for the sum of ``clients`` (m) discrete Gaussians N_Z(0, σ²)."""
    k = np.arange(1, clients, dtype=np.float64)
    return float(10 * np.exp(-2 * math.pi**2 * sigma**2 * k / (k + 1)).sum())


def ddg_rdp(l2: float, l1: float, sigma: float, clients: int, dim: int) -> np.ndarray:
    """ε(α) at every order of :data:`ORDERS` of the sum of ``clients`` clients' discrete Gaussian noise of scale
    ``sigma`` on inputs of sensitivity ``l2``, ``l1`` in ``dim`` coordinates (the module docstring's bound;
    infinite for σ < 1/2)."""
    alpha = np.asarray(ORDERS, dtype=np.float64)
    if sigma < 0.5:  # the bound's condition (Kairouz et al.): below it, nothing is claimed
        return np.full(alpha.shape, np.inf)
    tau = ddg_tau(sigma, clients)
    a2, a1 = l2 / (math.sqrt(clients) * sigma), l1 / (math.sqrt(clients) * sigma)
    first = alpha / 2 * a2**2 + tau * dim
    second = alpha / 2 * (a2**2 + 2 * a1 * tau + tau**2 * dim)
    third = alpha / 2 * (a2 + tau * math.sqrt(dim)) ** 2
    return np.minimum(np.minimum(first, second), third)


def skellam_rdp(l2: float, l1: float, variance: float) -> np.ndarray:
    """ε(α) at every order of :data:`ORDERS` of Skellam noise of total ``variance`` V on inputs of sensitivity
    ``l2``, ``l1`` (the module docstring's bound)."""
    alpha = np.asarray(ORDERS, dtype=np.float64)
    tail = np.minimum(((2 * alpha - 1) * l2**2 + 6 * l1) / (4 * variance**2), 3 * l1 / (2 * variance))
    return alpha * l2**2 / (2 * variance) + tail


def rdp_epsilon(rdp: np.ndarray, delta: float) -> float:
    """ε at ``delta`` of a curve over :data:`ORDERS` (``dp-accounting``'s conversion); 0 for the zero curve."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    if not rdp.any():
        return 0.0
    if np.isinf(rdp).all():
        return math.inf
    return float(compute_epsilon(list(ORDERS), [float(r) for r in rdp], delta)[0])
