"""Quantization of a client's update to the group Z_{2^b}, and the server's decoding of the group sum.

A client's update Δ (its trained weights minus the global weights, float64) becomes b-bit integers in four steps:

1. **clip** to L2 norm at most c (``secagg.clip``): x = Δ·min(1, c/‖Δ‖);
2. **rotate** (``secagg.rotation``): y = H·D·pad(x)/√d', the randomized Walsh–Hadamard transform of x padded with
   zeros to d' = 2^⌈log2 d⌉ coordinates, D a diagonal of random signs drawn from (seed, round), the same for every
   client of the round. R = H·D/√d' is orthogonal, so ‖y‖ = ‖x‖ <= c, and it spreads the update's energy over the
   coordinates (each is then of order c/√d' instead of up to c); without rotation y = x and d' = d;
3. **scale and round stochastically**: z = clamp(s·y, -ℓ, ℓ) with ℓ = s·c (the clamp only removes float round-off:
   |s·yᵢ| <= s·‖y‖ <= s·c), then qᵢ = ⌊zᵢ⌋ + 1[uᵢ < zᵢ - ⌊zᵢ⌋], uᵢ uniform from the client's own stream
   (seed, round, client): E[qᵢ] = zᵢ, |qᵢ - zᵢ| < 1, |qᵢ| <= ⌈ℓ⌉;
4. **reduce** q modulo 2^b (``secagg.bits``).

The server holds S = Σ_u q_u mod 2^b over the m clients whose inputs arrived. Its decoding: the centered lift
T̂ = S if S < 2^(b-1) else S - 2^b (the representative in [-2^(b-1), 2^(b-1))), unscaled and rotated back,
x̂ = D·H·(T̂/s)/√d' cut to d coordinates, divided by m: the mean update.

**No wrap-around.** T̂ equals the true integer sum T = Σ_u q_u exactly when -2^(b-1) <= T_i < 2^(b-1) for every i.
Since |T_i| <= m·⌈ℓ⌉ <= n·⌈ℓ⌉ for a cohort of n clients, the condition n·⌈s·c⌉ <= 2^(b-1) - 1 rules wrap-around out
(the sufficient n·(s·c + 1) <= 2^(b-1) follows from ⌈s·c⌉ < s·c + 1). The default scale (``secagg.scale: null``) is
the largest that meets it with an integer ℓ: ℓ = M = ⌊(2^(b-1) - 1 - h)/n⌋ and s = M/c, h the headroom reserved for
integer noise the clients add (distributed DP: :mod:`fedsim.secagg.ddp`, which also reserves
room for it its own way). A user's scale may break it: the sum then wraps for real.

**Rounding error.** Without wrap-around T̂ = T, and T_i - Σ_u z_u,i = Σ_u (q_u,i - z_u,i) has |·| < m. The decoded
mean differs from the mean of the clipped updates by e = Rᵀ(T - Σz)/(s·m) (cut to d coordinates), so

* without rotation: |e_i| < 1/s for every coordinate;
* with rotation: ‖e‖₂ < √d'/s, hence |e_i| < √d'/s (each entry of R has magnitude 1/√d').

These are worst cases (:meth:`Quantizer.error_bound`); the errors are independent, zero-mean and at most 1 in size,
so the typical error of a coordinate of the mean is about 1/(2·s·√m).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedsim.secagg.seeds import ROTATION, ROUNDING, stream_seed

MAX_ROUNDINGS = 1000  # conditional rounding's tries: each fails with probability at most β < 1 (e^(-1/2) by default)


def padded_size(size: int, rotation: bool) -> int:
    """d': the coordinates a client sends for a ``size``-coordinate update (the next power of two when rotating)."""
    return 1 << max(0, (size - 1).bit_length()) if rotation else size


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """H·x for a vector of 2^k entries, H the (unnormalized, symmetric, H·H = d'·I) Walsh–Hadamard matrix, in
    O(d' log d') additions (float64 in, float64 out)."""
    size, width = x.numel(), 1
    y = x.reshape(1, size)
    while width < size:
        pairs = y.reshape(-1, 2, width)
        y = torch.stack((pairs[:, 0] + pairs[:, 1], pairs[:, 0] - pairs[:, 1]), dim=1).reshape(1, size)
        width *= 2
    return y.reshape(size)


def rotation_signs(seed: int, round_num: int, size: int) -> torch.Tensor:
    """D's diagonal for round ``round_num``: ``size`` random signs (float64), the same for every client."""
    generator = torch.Generator().manual_seed(stream_seed(seed, ROTATION, round_num))
    return torch.randint(0, 2, (size,), generator=generator).double() * 2 - 1


def rotate(x: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """R·pad(x) = H·D·pad(x)/√d' (d' = ``signs.numel()``)."""
    padded = torch.zeros(signs.numel(), dtype=torch.float64)
    padded[: x.numel()] = x
    return hadamard(padded * signs) / math.sqrt(signs.numel())


def unrotate(y: torch.Tensor, signs: torch.Tensor, size: int) -> torch.Tensor:
    """Rᵀ·y = D·H·y/√d', cut to its first ``size`` coordinates."""
    return (hadamard(y) * signs / math.sqrt(signs.numel()))[:size]


def default_levels(bits: int, cohort: int, headroom: int = 0) -> int:
    """M = ⌊(2^(b-1) - 1 - headroom)/n⌋: the largest integer bound on a client's |qᵢ| for which the sum of
    ``cohort`` inputs (and noise of at most ``headroom`` in magnitude) cannot wrap around (0: none fits)."""
    return max(0, (2 ** (bits - 1) - 1 - headroom) // cohort)


def sigma_levels(bits: int, cohort: int, dim: int, sigmas: float, noise: float = 0.0) -> int:
    """The papers' scale (Kairouz, Liu, Steinke 2021, §4; Agarwal, Kairouz, Liu 2021): the largest integer ℓ with
    which k = ``sigmas`` standard deviations of a coordinate of the sum fit in [−2^(b−1), 2^(b−1)), the sum's
    coordinate taken as a centred variable of variance ℓ²·(n²/d' + ``noise``) + n/4: n inputs of norm ℓ whose sum
    (of norm at most n·ℓ) the rotation spreads evenly over d' coordinates, their noise of variance ``noise``·ℓ²
    (z²·n/K for distributed DP) and the rounding's (at most 1/4 a client). Unlike :func:`default_levels` it does
    not rule wrap-around out: a coordinate beyond k standard deviations wraps (0: none fits)."""
    room = ((2 ** (bits - 1) - 1) / sigmas) ** 2 - cohort / 4
    return max(0, math.floor(math.sqrt(max(0.0, room) / (cohort**2 / dim + noise))))


def rounding_generator(seed: int, round_num: int, client_id: int) -> torch.Generator:
    """The generator of ``client_id``'s stochastic rounding in round ``round_num``."""
    return torch.Generator().manual_seed(stream_seed(seed, ROUNDING, round_num, client_id))


def to_group(q: torch.Tensor, bits: int) -> torch.Tensor:
    """q mod 2^b, in [0, 2^b) (int64)."""
    return torch.remainder(q, 2**bits)


def centered(total: torch.Tensor, bits: int) -> torch.Tensor:
    """The centered lift of a group element: its representative in [-2^(b-1), 2^(b-1)) (int64)."""
    total = torch.remainder(total, 2**bits)
    return torch.where(total >= 2 ** (bits - 1), total - 2**bits, total)


@dataclass(frozen=True)
class Quantizer:
    """One round's quantization: ``bits`` b, ``clip`` c, ``scale`` s, ``levels`` ℓ (the clamp, s·c; an integer for
    the default scale) and ``signs`` (D's diagonal; ``None``: no rotation)."""

    bits: int
    clip: float
    scale: float
    levels: float
    signs: torch.Tensor | None

    def coordinates(self, size: int) -> int:
        """d' for a ``size``-coordinate update."""
        return size if self.signs is None else self.signs.numel()

    def clip_update(self, delta: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """(the update clipped to L2 norm c, float64; whether the clip bound it)."""
        delta = delta.double()
        norm = float(torch.linalg.vector_norm(delta))
        return (delta * (self.clip / norm), True) if norm > self.clip else (delta, False)

    def quantize(self, clipped: torch.Tensor, generator: torch.Generator, bound: float | None = None) -> torch.Tensor:
        """A clipped update's integers q (int64, d' of them, not yet reduced mod 2^b): rotated, scaled, clamped and
        stochastically rounded with ``generator``. With a ``bound`` (conditional randomized rounding, Kairouz, Liu,
        Steinke, ICML 2021): rounded again, from the same generator, until ‖q‖₂ <= ``bound`` (the norm in float64)."""
        y = clipped if self.signs is None else rotate(clipped, self.signs)
        z = torch.clamp(y * self.scale, -self.levels, self.levels)
        low = torch.floor(z)
        for _ in range(MAX_ROUNDINGS):
            up = torch.rand(z.numel(), generator=generator, dtype=torch.float64) < (z - low)
            q = low.long() + up.long()
            if bound is None or float(q.double().square().sum()) <= bound * bound:
                return q
        raise RuntimeError(f"conditional rounding: no rounding within the bound {bound} in {MAX_ROUNDINGS} tries")

    def decode(self, total: torch.Tensor, count: int, size: int) -> torch.Tensor:
        """The mean update (float64, ``size`` coordinates) of ``count`` inputs from their group sum ``total``."""
        lifted = centered(total, self.bits).double() / self.scale
        summed = lifted if self.signs is None else unrotate(lifted, self.signs, size)
        return summed / count

    def error_bound(self, size: int) -> float:
        """The worst-case error of one coordinate of the decoded mean when the sum did not wrap (module docstring):
        1/s, or √d'/s with rotation."""
        return (1.0 if self.signs is None else math.sqrt(self.coordinates(size))) / self.scale
