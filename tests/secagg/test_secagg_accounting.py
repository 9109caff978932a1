"""Distributed DP's accounting (fedsim/secagg/accounting.py, ddp.py) against the papers' formulas computed here on
their own: the rounded sensitivities and τ by hand, one order of each Rényi bound by hand, ε over all orders with the
conversion written out here (Canonne, Kamath, Steinke 2020, Proposition 12), the distributed discrete Gaussian at
large σ against dp-accounting's Gaussian mechanism, composition over rounds, and the noise multiplier solved from a
target ε.

The formulas (docs/secure-aggregation.md, "Distributed differential privacy"):
Δ₂ = min(ℓ + √d, √(ℓ² + d/4 + √(2 ln(1/β))·(ℓ + √d/2))), Δ₁ = Δ₂·min(√d, Δ₂);
DDG (Kairouz, Liu, Steinke 2021, Prop. 14 with Thm. 1's τ = 10·Σ_{k<m} exp(−2π²σ²k/(k+1)), a = Δ/(√m·σ)):
ε(α) = min(α/2·a₂² + τd, α/2·(a₂² + 2a₁τ + τ²d), α/2·(a₂ + τ√d)²);
Skellam (Agarwal, Kairouz, Liu 2021, total variance V): ε(α) = αΔ₂²/(2V) + min(((2α−1)Δ₂² + 6Δ₁)/(4V²), 3Δ₁/(2V)).
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest

from fedsim.secagg import DistributedDP
from fedsim.secagg.accounting import (
    ORDERS,
    ddg_rdp,
    ddg_tau,
    rdp_epsilon,
    rounded_l1_bound,
    rounded_l2_bound,
    skellam_rdp,
)
from fedsim.secagg.ddp import DEFAULT_BETA


def _epsilon(rdp: list[float], delta: float) -> float:
    """min over the orders of rdp + ln(1 − 1/α) − ln(δ·α)/(α − 1) (CKS20, Proposition 12), not below 0."""
    return max(
        0.0, min(r + math.log1p(-1 / a) - math.log(delta * a) / (a - 1) for a, r in zip(ORDERS, rdp, strict=True))
    )


def _ddg(l2: float, l1: float, sigma: float, m: int, d: int) -> list[float]:
    tau = 10 * sum(math.exp(-2 * math.pi**2 * sigma**2 * k / (k + 1)) for k in range(1, m))
    a2, a1 = l2 / (math.sqrt(m) * sigma), l1 / (math.sqrt(m) * sigma)
    return [
        min(
            a / 2 * a2**2 + tau * d, a / 2 * (a2**2 + 2 * a1 * tau + tau**2 * d), a / 2 * (a2 + tau * math.sqrt(d)) ** 2
        )
        for a in ORDERS
    ]


def _skellam(l2: float, l1: float, v: float) -> list[float]:
    return [a * l2**2 / (2 * v) + min(((2 * a - 1) * l2**2 + 6 * l1) / (4 * v**2), 3 * l1 / (2 * v)) for a in ORDERS]


def test_the_rounded_sensitivities_by_hand() -> None:
    # β = e^(−1/2): √(2 ln(1/β)) = 1. ℓ = 3, d = 16: √(9 + 16/4 + (3 + 4/2)) = √18 < 3 + 4.
    assert rounded_l2_bound(3.0, 16, DEFAULT_BETA) == pytest.approx(math.sqrt(18), rel=1e-15)
    assert rounded_l2_bound(3.0, 16, 0.0) == 7.0  # β = 0: unconditional rounding, ℓ + √d
    # ℓ = 1000, d = 1, β = 1e-300: √(1e6 + 1/4 + √(2·300·ln 10)·1000.5) ≈ 1018.4 > 1000 + 1
    assert rounded_l2_bound(1000.0, 1, 1e-300) == 1001.0
    assert (
        rounded_l1_bound(4.0, 16) == 16.0 and rounded_l1_bound(2.0, 100) == 4.0 and rounded_l1_bound(50.0, 16) == 200.0
    )


def test_tau_and_one_order_of_each_bound_by_hand() -> None:
    assert ddg_tau(0.5, 3) == pytest.approx(10 * (math.exp(-(math.pi**2) / 4) + math.exp(-(math.pi**2) / 3)), rel=1e-14)
    assert ddg_tau(3.0, 1) == 0.0  # one client: its noise is a discrete Gaussian, no τ
    # Skellam at α = 2 with Δ₂ = 2, Δ₁ = 4, V = 10: 2·4/20 + min((3·4 + 24)/400, 12/20) = 0.4 + 0.09
    assert skellam_rdp(2.0, 4.0, 10.0)[0] == pytest.approx(0.49, rel=1e-14)
    # DDG at α = 2, Δ₂ = 3, Δ₁ = 9, σ = 1, m = 4, d = 9: a₂ = 1.5, a₁ = 4.5, τ = 10(e^(−π²) + e^(−4π²/3) + e^(−3π²/2))
    tau = 10 * (math.exp(-(math.pi**2)) + math.exp(-4 * math.pi**2 / 3) + math.exp(-3 * math.pi**2 / 2))
    expected = min(2.25 + 9 * tau, 2.25 + 9 * tau + 9 * tau**2, (1.5 + 3 * tau) ** 2)
    assert ddg_rdp(3.0, 9.0, 1.0, 4, 9)[0] == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize(
    ("levels", "dim", "sigma", "clients", "rounds"),
    [
        (200.0, 1024, 0.55, 20, 10),  # small noise: τ is large, and the bound's three terms trade places
        (2000.0, 2**20, 900.0, 100, 100),  # the papers' regime: d' of a million, 100 clients a round
        (60.0, 1024, 4.0, 1000, 30),  # low bits: rounding inflates Δ₂ (d/4 against ℓ²)
    ],
)
def test_epsilon_of_both_mechanisms_is_the_papers_formula(
    levels: float, dim: int, sigma: float, clients: int, rounds: int
) -> None:
    l2 = math.sqrt(min((levels + math.sqrt(dim)) ** 2, levels**2 + dim / 4 + levels + math.sqrt(dim) / 2))
    l1 = l2 * min(math.sqrt(dim), l2)
    assert rounded_l2_bound(levels, dim, DEFAULT_BETA) == pytest.approx(l2, rel=1e-14)
    ddg = [rounds * r for r in _ddg(l2, l1, sigma, clients, dim)]
    assert rdp_epsilon(rounds * ddg_rdp(l2, l1, sigma, clients, dim), 1e-5) == pytest.approx(
        _epsilon(ddg, 1e-5), rel=1e-12
    )
    sk = [rounds * r for r in _skellam(l2, l1, clients * sigma**2)]
    got = rdp_epsilon(rounds * skellam_rdp(l2, l1, clients * sigma**2), 1e-5)
    assert got == pytest.approx(_epsilon(sk, 1e-5), rel=1e-12)


@pytest.mark.parametrize(("z", "rounds"), [(0.8, 1), (1.0, 30), (2.5, 200)])
def test_at_large_sigma_the_distributed_discrete_gaussian_is_the_gaussian_mechanism(z: float, rounds: int) -> None:
    """σ = 50 per client: τ < 1e-300, so the bound is α/2·(Δ₂/(√m·σ))², the Gaussian mechanism's with noise
    multiplier √m·σ/Δ₂: dp-accounting's RDP accountant over the same orders gives the same ε."""
    m, sigma = 16, 50.0
    l2 = math.sqrt(m) * sigma / z
    ours = rdp_epsilon(rounds * ddg_rdp(l2, l2 * 32, sigma, m, 1024), 1e-5)
    accountant = dp_accounting.rdp.RdpAccountant(orders=list(ORDERS))
    accountant.compose(dp_accounting.GaussianDpEvent(z), rounds)
    assert ours == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)


def test_the_ledger_composes_rounds_by_adding_their_curves() -> None:
    dp = DistributedDP(mechanism="skellam", noise_multiplier=1.2)
    noise = dp.noise(1.2, 500.0, 1024, 10)
    assert noise.sigma == pytest.approx(1.2 * 500 / math.sqrt(10), rel=1e-15)
    for _ in range(5):
        last = dp.record(noise, 10)
    assert dp.rounds == 5 and last == pytest.approx(rdp_epsilon(5 * noise.rdp(10), 1e-5), rel=1e-12)
    fewer = dp.epsilon(noise.rdp(6))  # a round in which 6 clients' noise reached the sum costs more than one of 10
    assert fewer > dp.epsilon(noise.rdp(10)) > last


@pytest.mark.parametrize("mechanism", ["ddg", "skellam"])
def test_the_noise_multiplier_solved_from_a_target_is_the_smallest_that_meets_it(mechanism: str) -> None:
    dp = DistributedDP(mechanism=mechanism, epsilon=3.0, delta=1e-6)
    levels = lambda z: dp.levels(16, 20, 20, z)  # noqa: E731 - the stage's default scale for 20 clients at b = 16
    z = dp.solve(levels, 1024, 20, 50)
    spent = rdp_epsilon(50 * dp.noise(z, levels(z), 1024, 20).rdp(20), 1e-6)
    below = z * (1 - 1e-6)
    assert spent <= 3.0 < rdp_epsilon(50 * dp.noise(below, levels(below), 1024, 20).rdp(20), 1e-6)
    assert dp.z == z and DistributedDP(mechanism=mechanism, noise_multiplier=z).solve(levels, 1024, 20, 50) == z


def test_a_target_no_noise_can_reach_is_one_line() -> None:
    dp = DistributedDP(mechanism="ddg", epsilon=0.01)
    with pytest.raises(ValueError) as error:
        dp.solve(lambda z: dp.levels(8, 20, 20, z), 1024, 20, 1000)
    assert str(error.value).startswith("secagg.dp.epsilon=0.01 cannot be reached in 1000 rounds of 20 clients")


def test_the_zero_curve_is_epsilon_zero_and_orders_are_the_authors() -> None:
    assert rdp_epsilon(np.zeros(len(ORDERS)), 1e-5) == 0.0
    assert rdp_epsilon(ddg_rdp(10.0, 100.0, 0.49, 4, 16), 1e-5) == math.inf  # σ < 1/2: the DDG bound claims nothing
    assert ORDERS[:3] == (2, 3, 4) and ORDERS[-2:] == (128, 256) and len(ORDERS) == 128
