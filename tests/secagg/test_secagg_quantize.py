"""Quantization to Z_2^b (fedsim/secagg/quantize.py): the Walsh–Hadamard rotation against its matrix, stochastic
rounding, the default scale that rules wrap-around out, the decoding error within the derived bound (over random
cohorts, sizes, clips and b, with inputs that put all their mass on one coordinate, the worst case for wrapping),
and a wrap-around that happens for real when a user's scale is too large."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsim.secagg.quantize import (
    Quantizer,
    centered,
    default_levels,
    hadamard,
    padded_size,
    rotate,
    rotation_signs,
    rounding_generator,
    to_group,
    unrotate,
)


def _sylvester(size: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


@pytest.mark.parametrize("size", [1, 2, 8, 64])
def test_the_fast_transform_is_the_hadamard_matrix(size: int) -> None:
    x = torch.randn(size, dtype=torch.float64, generator=torch.Generator().manual_seed(size))
    assert torch.allclose(hadamard(x), _sylvester(size) @ x, rtol=0, atol=1e-12)


def test_the_rotation_is_orthogonal_and_seeded_by_seed_and_round() -> None:
    x = torch.randn(37, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    signs = rotation_signs(5, 3, padded_size(37, True))
    assert signs.numel() == 64 and set(signs.tolist()) == {-1.0, 1.0}
    y = rotate(x, signs)
    assert math.isclose(float(y.norm()), float(x.norm()), rel_tol=1e-12)
    assert torch.allclose(unrotate(y, signs, 37), x, rtol=0, atol=1e-12)
    assert torch.equal(rotation_signs(5, 3, 64), signs) and not torch.equal(rotation_signs(5, 4, 64), signs)


def test_stochastic_rounding_picks_a_neighbour_and_is_unbiased() -> None:
    quantizer = Quantizer(bits=16, clip=1.0, scale=1.0, levels=1.0, signs=None)
    z = torch.full((40_000,), 0.3, dtype=torch.float64)
    q = quantizer.quantize(z, rounding_generator(0, 1, 7))
    assert set(q.unique().tolist()) == {0, 1}
    # E[q] = 0.3, std of the mean sqrt(0.3·0.7/40000) = 0.0023: five of them
    assert abs(float(q.double().mean()) - 0.3) < 5 * math.sqrt(0.21 / 40_000)
    assert torch.equal(q, quantizer.quantize(z, rounding_generator(0, 1, 7)))  # pure in (seed, round, client)


def test_the_default_levels_leave_the_sum_inside_the_group() -> None:
    assert default_levels(16, 10) == 3276  # ⌊(2^15 - 1)/10⌋
    assert default_levels(8, 127) == 1 and default_levels(8, 128) == 0
    assert default_levels(32, 4, headroom=3) == (2**31 - 1 - 3) // 4
    assert centered(torch.tensor([0, 127, 128, 255, 256 + 5]), 8).tolist() == [0, 127, -128, -1, 5]


@settings(max_examples=80, deadline=None)
@given(
    bits=st.integers(8, 32),
    n=st.integers(1, 20),
    size=st.integers(1, 40),
    clip=st.floats(0.01, 100.0),
    rotation=st.booleans(),
    worst=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_decoding_is_within_the_derived_bound_and_never_wraps_with_the_default_scale(
    bits: int, n: int, size: int, clip: float, rotation: bool, worst: bool, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    if worst:  # every client's whole norm (beyond the clip) on coordinate 0, the same sign: the largest sum
        updates = [torch.zeros(size, dtype=torch.float64).index_fill_(0, torch.tensor([0]), 3 * clip)] * n
    else:
        updates = [torch.randn(size, dtype=torch.float64, generator=generator) * clip for _ in range(n)]
    levels = default_levels(bits, n)
    signs = rotation_signs(1, 2, padded_size(size, True)) if rotation else None
    quantizer = Quantizer(bits, clip, levels / clip, float(levels), signs)
    clipped = [quantizer.clip_update(u)[0] for u in updates]
    qs = [quantizer.quantize(c, rounding_generator(seed, 1, i)) for i, c in enumerate(clipped)]
    true_sum = torch.stack(qs).sum(0)
    assert int(true_sum.abs().max()) <= 2 ** (bits - 1) - 1  # n·M <= 2^(b-1) - 1: no wrap-around
    group_sum = to_group(torch.stack([to_group(q, bits) for q in qs]).sum(0), bits)
    decoded = quantizer.decode(group_sum, n, size)
    exact = torch.stack(clipped).mean(0)
    # the bound (1/s, or √d'/s with rotation) plus float64 round-off of the transforms (< 1e-12·clip at these sizes)
    assert float((decoded - exact).abs().max()) <= quantizer.error_bound(size) + 1e-9 * clip


def test_a_scale_too_large_for_the_cohort_wraps_around_for_real() -> None:
    """4 clients, b = 8, scale 100, each update (1, 0, 0) at the clip: q = (100, 0, 0) each, the true sum 400, which
    mod 256 is 144, lifted to 144 - 256 = -112: the decoded mean is -112/100/4 = -0.28 instead of 1."""
    quantizer = Quantizer(bits=8, clip=1.0, scale=100.0, levels=100.0, signs=None)
    update = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    qs = [quantizer.quantize(update, rounding_generator(0, 1, c)) for c in range(4)]
    assert all(q.tolist() == [100, 0, 0] for q in qs)
    total = to_group(sum(to_group(q, 8) for q in qs), 8)
    assert quantizer.decode(total, 4, 3).tolist() == [-0.28, 0.0, 0.0]
