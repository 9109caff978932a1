"""The two kinds of update codec, and the float casts.

A *sparsifier* picks which coordinates of a vector are sent (the receiver learns the positions from index bytes or a
seed); a *value codec* encodes the numbers that are sent. A direction's chain (:mod:`fedsim.comm.pipeline`) applies
its sparsifiers in order, then at most one value codec, to the values left. Every codec returns what the receiver
decodes, in float32, and the exact size of what it sent; randomness comes only from the generator it is given, which
the pipeline seeds from (seed, round, client, direction), so results never depend on where a task ran.

Sizes are those of a plain fixed-width encoding (no entropy coding): float32 values 4 bytes, float16/bfloat16 2,
indices int32 (4 bytes), a b-bit quantised value b bits, rounded up to whole bytes per tensor.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

FLOAT32_BYTES = 4
INDEX_BYTES = 4  # int32 positions: enough for models of up to 2^31 parameters


@dataclass(frozen=True)
class Selection:
    """What a sparsifier keeps of an ``n``-vector: the kept ``positions`` (ascending int64), the factor the receiver
    multiplies the decoded values by (``scale``, 1 unless the sparsifier is unbiased) and the bytes that tell the
    receiver the positions."""

    positions: torch.Tensor
    scale: float
    side_bytes: int


class Sparsifier(ABC):
    """Chooses which coordinates are sent."""

    @abstractmethod
    def select(self, values: torch.Tensor, generator: torch.Generator) -> Selection:
        """The coordinates of ``values`` (1-D float32) to send."""

    @abstractmethod
    def kept(self, n: int) -> int:
        """How many of ``n`` coordinates :meth:`select` keeps (a function of ``n`` alone, so sizes are known before
        training: the simulated clock needs them)."""

    @abstractmethod
    def side_bytes(self, n: int) -> int:
        """The bytes that describe the positions kept of ``n`` coordinates."""


class ValueCodec(ABC):
    """Encodes a vector of values; lossy."""

    @abstractmethod
    def code(self, values: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """What the receiver decodes from ``values`` (1-D float32), as float32."""

    @abstractmethod
    def nbytes(self, n: int) -> int:
        """The bytes that encode ``n`` values."""


class Float16(ValueCodec):
    """Values cast to IEEE half precision (round to nearest even): 2 bytes each. Values beyond ±65504 become
    infinite, and the server rejects such an update as non-finite; use :class:`BFloat16` for updates that large."""

    dtype = torch.float16

    def code(self, values: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return values.to(self.dtype).to(torch.float32)

    def nbytes(self, n: int) -> int:
        return 2 * n

    def __repr__(self) -> str:
        return type(self).__name__ + "()"


class BFloat16(Float16):
    """Values cast to bfloat16 (float32's exponent range, 8 significant bits): 2 bytes each."""

    dtype = torch.bfloat16
