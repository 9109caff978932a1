"""t-of-n Shamir secret sharing over the prime field GF(p), p = 2^127 - 1 (a Mersenne prime).

A secret a₀ < p is the constant term of a random polynomial f(x) = a₀ + a₁x + ... + a_{t-1}x^{t-1} over GF(p); the
holder with id h gets the share f(h + 1) (x-coordinates 1, 2, ...: never 0, which would be the secret itself). Any t
shares determine f, so the secret is f(0) by Lagrange interpolation, a₀ = Σ_j y_j Π_{i≠j} x_i/(x_i - x_j); fewer than
t shares say nothing about it (every a₀ fits them with some polynomial). The secrets shared in secure aggregation
(each client's key-agreement secret and its self-mask seed, :mod:`fedsim.secagg.masking`) are field elements
themselves, so a share is one field element: 127 bits, 16 bytes on the wire (:mod:`fedsim.secagg.costs`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

PRIME = 2**127 - 1


def share_point(holder: int) -> int:
    """The x-coordinate of ``holder``'s share: its client id + 1."""
    return holder + 1


def split(secret: int, coefficients: Sequence[int], holders: Sequence[int]) -> dict[int, int]:
    """Each holder's share of ``secret`` (by holder id): f(holder + 1), f's constant term ``secret`` and its other
    coefficients ``coefficients`` (t - 1 random field elements for a threshold t)."""
    if not 0 <= secret < PRIME:
        raise ValueError(f"a secret must be a field element in [0, 2^127 - 1) (got {secret})")
    shares = {}
    for holder in holders:
        x, value = share_point(holder), 0
        for a in reversed([secret, *coefficients]):  # Horner's rule
            value = (value * x + a) % PRIME
        shares[holder] = value
    return shares


def reconstruct(shares: Mapping[int, int]) -> int:
    """The secret (f(0)) from shares by holder id: exact when there are at least t of them, Lagrange interpolation
    at 0 over GF(p)."""
    points = [(share_point(h), y) for h, y in shares.items()]
    secret = 0
    for j, (xj, yj) in enumerate(points):
        numerator, denominator = 1, 1
        for i, (xi, _) in enumerate(points):
            if i != j:
                numerator = numerator * xi % PRIME
                denominator = denominator * (xi - xj) % PRIME
        secret = (secret + yj * numerator * pow(denominator, PRIME - 2, PRIME)) % PRIME
    return secret
