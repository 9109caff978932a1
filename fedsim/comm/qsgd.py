"""Stochastic uniform quantisation, QSGD: Alistarh, Grubic, Li, Tomioka and Vojnovic, "QSGD: Communication-Efficient
SGD via Gradient Quantization and Encoding", NeurIPS 2017.

The vector is cut into buckets of ``bucket_size`` values (the paper's bucketing; the last bucket may be shorter). For
a bucket v with L2 norm ‖v‖ and s = 2^(bits-1) − 1 levels, each value is sent as its sign and a level
l ∈ {0, …, s}: with r = s·|v_i|/‖v‖, l = ⌊r⌋ + 1 with probability r − ⌊r⌋, else ⌊r⌋, so the decoded value
sign(v_i)·l·‖v‖/s is an unbiased estimate of v_i (E = v_i). Encoding: ``bits`` bits per value (sign included, fixed
width; the paper's Elias coding would be shorter) and one float32 norm per bucket.

The norm is float32's own ``vector_norm`` where that is accurate: a bucket whose largest |v_i| is at least 2^-63 (its
square is a normal float32) and whose sum of squares does not overflow. Elsewhere (a bucket of values below about
1e-19, whose squares underflow to subnormals or 0, or of values above about 1e19) it is computed in float64 and
rounded to float32, so such a bucket still decodes to an unbiased estimate instead of all zeros (or NaN).
"""

from __future__ import annotations

import math

import torch

from fedsim.comm.codecs import FLOAT32_BYTES, ValueCodec
from fedsim.core.checks import integer

SMALLEST_SAFE = 2.0**-63
"""The smallest |v| whose float32 square is a normal number (2^-126): below it float32 sums of squares lose bits."""


def bucket_norms(rows: torch.Tensor) -> torch.Tensor:
    """The L2 norm of each row of a float32 (buckets, size) tensor, as a (buckets, 1) float32 column: float32's
    ``vector_norm``, recomputed in float64 (then rounded to float32) for the rows where float32 underflows or
    overflows (see the module docstring). Every other row's norm is float32's, bit for bit."""
    norms = torch.linalg.vector_norm(rows, dim=1, keepdim=True)
    largest = rows.abs().amax(dim=1, keepdim=True)
    redo = (((largest > 0) & (largest < SMALLEST_SAFE)) | torch.isinf(norms)).view(-1)
    if bool(redo.any()):
        norms[redo] = torch.linalg.vector_norm(rows[redo].double(), dim=1, keepdim=True).to(torch.float32)
    return norms


class QSGD(ValueCodec):
    """``bits`` per value (2 to 8, sign included) and a float32 norm per ``bucket_size`` values."""

    def __init__(self, bits: int = 8, bucket_size: int = 512) -> None:
        integer("qsgd.bits", bits, 2, 8, hint=": a sign bit and at least one level bit")
        integer("qsgd.bucket_size", bucket_size, 1)
        self.bits, self.bucket_size = bits, bucket_size
        self.levels = 2 ** (bits - 1) - 1

    def code(self, values: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        n = values.numel()
        if n == 0:
            return values.clone()
        buckets = math.ceil(n / self.bucket_size)
        padded = torch.zeros(buckets * self.bucket_size, dtype=torch.float32)
        padded[:n] = values
        rows = padded.view(buckets, self.bucket_size)
        norms = bucket_norms(rows)
        ratio = rows.abs() / torch.where(norms > 0, norms, torch.ones_like(norms)) * self.levels
        floor = ratio.floor()
        draws = torch.rand(rows.shape, generator=generator, dtype=torch.float32)
        # at most s: a ratio rounded above 1 in float32 (values whose squares are subnormal) must not give s + 1
        level = (floor + (draws < ratio - floor).to(torch.float32)).clamp(max=self.levels)
        decoded = torch.sign(rows) * level * (norms / self.levels)
        return decoded.view(-1)[:n].clone()

    def nbytes(self, n: int) -> int:
        return math.ceil(n / self.bucket_size) * FLOAT32_BYTES + math.ceil(n * self.bits / 8)

    def __repr__(self) -> str:
        return f"QSGD(bits={self.bits}, bucket_size={self.bucket_size})"
