"""Distributed DP's samplers (fedsim/secagg/noise.py): the discrete Gaussian's probabilities against its exact pmf, both
samplers' mean and variance within bounds derived from the sample size, and the same bits from the same stream.

Tolerances: for n independent draws of variance v and fourth central moment m₄, the sample mean has standard error
√(v/n) and the sample variance √((m₄ − v²)/n); the tests allow 5 standard errors (a false failure has probability
below 1e-6 per check). The fourth moments are computed here from the exact pmf (discrete Gaussian) or from the
Poisson cumulants (Skellam: κ₂ = 2λ, κ₄ = 2λ, so m₄ = κ₄ + 3κ₂²)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsim.secagg.noise import discrete_gaussian, discrete_laplace, noise_generator, skellam

DRAWS = 200_000


def _pmf(sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """The discrete Gaussian's support (|y| <= 40σ + 10, beyond which the mass is below 1e-300) and probabilities."""
    ys = np.arange(-math.ceil(40 * sigma) - 10, math.ceil(40 * sigma) + 11)
    weights = np.exp(-(ys.astype(np.float64) ** 2) / (2 * sigma**2))
    return ys, weights / weights.sum()


@pytest.mark.parametrize("sigma", [0.4, 1.0, 3.7, 50.0, 2000.0])
def test_the_discrete_gaussian_has_its_mean_and_variance(sigma: float) -> None:
    ys, p = _pmf(sigma)
    variance = float((ys**2 * p).sum())  # below σ² for small σ: 0.4 gives 0.0767, not 0.16
    fourth = float((ys.astype(np.float64) ** 4 * p).sum())
    x = discrete_gaussian(noise_generator(7, 1, 3), sigma, DRAWS).astype(np.float64)
    assert abs(x.mean()) <= 5 * math.sqrt(variance / DRAWS)
    assert abs(x.var() - variance) <= 5 * math.sqrt((fourth - variance**2) / DRAWS)


@pytest.mark.parametrize("sigma", [0.6, 2.5])
def test_the_discrete_gaussian_s_frequencies_are_its_pmf(sigma: float) -> None:
    """Each value's count against n·p(y): a binomial count, within 5 standard deviations √(n·p·(1 − p)) + 1."""
    ys, p = _pmf(sigma)
    x = discrete_gaussian(noise_generator(0, 2, 5), sigma, DRAWS)
    counts = {int(v): int(c) for v, c in zip(*np.unique(x, return_counts=True), strict=True)}
    for y, prob in zip(ys, p, strict=True):
        expected = DRAWS * prob
        assert abs(counts.get(int(y), 0) - expected) <= 5 * math.sqrt(expected * (1 - prob)) + 1, int(y)


def test_the_discrete_laplace_has_the_variance_of_its_pmf() -> None:
    """P(y) ∝ e^(−|y|/t): with r = e^(−1/t), Var = 2r/(1 − r)² (the two-sided geometric's)."""
    t = 3
    r = math.exp(-1 / t)
    variance = 2 * r / (1 - r) ** 2
    x = discrete_laplace(noise_generator(1, 1, 1), t, DRAWS).astype(np.float64)
    fourth = 2 * r * (1 + 10 * r + r * r) / (1 - r) ** 4  # Σ y⁴ r^|y| (1 − r)/(1 + r)
    assert abs(x.mean()) <= 5 * math.sqrt(variance / DRAWS)
    assert abs(x.var() - variance) <= 5 * math.sqrt((fourth - variance**2) / DRAWS)


@pytest.mark.parametrize("variance", [0.5, 37.2, 1.0e6])
def test_the_skellam_has_mean_zero_and_its_variance(variance: float) -> None:
    lam = variance / 2
    fourth = 2 * lam + 3 * (2 * lam) ** 2
    x = skellam(noise_generator(3, 4, 2), variance, DRAWS).astype(np.float64)
    assert abs(x.mean()) <= 5 * math.sqrt(variance / DRAWS)
    assert abs(x.var() - variance) <= 5 * math.sqrt((fourth - variance**2) / DRAWS)


def test_the_noise_is_the_same_bits_from_the_same_stream_and_differs_between_clients() -> None:
    for draw in (lambda g: discrete_gaussian(g, 12.5, 4096), lambda g: skellam(g, 12.5**2, 4096)):
        first, again = draw(noise_generator(5, 3, 8)), draw(noise_generator(5, 3, 8))
        assert first.dtype == np.int64 and np.array_equal(first, again)
        assert not np.array_equal(first, draw(noise_generator(5, 3, 9)))  # another client
        assert not np.array_equal(first, draw(noise_generator(5, 4, 8)))  # another round
        assert not np.array_equal(first, draw(noise_generator(6, 3, 8)))  # another seed
