"""Ragged per-client index arrays held as one flat array and offsets (issue #35: a million clients).

A list of a million small numpy arrays costs about 100 bytes of header per array and a Python loop to build; a
:class:`Shares` holds the same indices in two arrays, so it is built with vectorised numpy, pickles as two arrays and
still reads as a sequence of per-client arrays (``len``, ``shares[i]``, iteration).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np


class Shares(Sequence[np.ndarray]):
    """Client ``i``'s indices are ``flat[offsets[i]:offsets[i + 1]]``; ``shares[i]`` is that slice, a view.

    Read-only as a sequence (no item assignment); the views share ``flat``'s memory, as ``np.split``'s pieces do.
    """

    __slots__ = ("flat", "offsets")

    def __init__(self, flat: np.ndarray, offsets: np.ndarray) -> None:
        flat, offsets = np.asarray(flat), np.asarray(offsets)
        if flat.ndim != 1 or offsets.ndim != 1 or len(offsets) == 0:
            raise ValueError(
                f"Shares: flat and offsets must be 1-D, offsets non-empty (got {flat.shape}, {offsets.shape})"
            )
        if offsets[0] != 0 or offsets[-1] != len(flat) or np.any(np.diff(offsets) < 0):
            raise ValueError("Shares: offsets must rise from 0 to len(flat)")
        self.flat = flat.astype(np.int64, copy=False)
        self.offsets = offsets.astype(np.int64, copy=False)

    @classmethod
    def from_sizes(cls, flat: np.ndarray, sizes: np.ndarray) -> Shares:
        """Consecutive pieces of ``flat`` with the given sizes (which sum to its length)."""
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        return cls(flat, offsets)

    @classmethod
    def of(cls, parts: Sequence[np.ndarray]) -> Shares:
        """``parts`` as :class:`Shares` (itself when it already is one; a list of arrays is concatenated once)."""
        if isinstance(parts, Shares):
            return parts
        sizes = np.fromiter((len(part) for part in parts), dtype=np.int64, count=len(parts))
        if not len(parts):
            return cls(np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64))
        return cls.from_sizes(np.concatenate([np.asarray(part, dtype=np.int64).ravel() for part in parts]), sizes)

    @property
    def sizes(self) -> np.ndarray:
        """How many indices each client holds (``int64``, one entry per client)."""
        return np.diff(self.offsets)

    def owners(self) -> np.ndarray:
        """The client of every entry of ``flat`` (``int64``, aligned with ``flat``)."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.sizes)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, index: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, index: slice) -> list[np.ndarray]: ...

    def __getitem__(self, index: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        count = len(self)
        i = int(index)
        if not -count <= i < count:
            raise IndexError(f"client {index} out of range for {count} clients")
        i %= count
        return self.flat[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        flat, offsets = self.flat, self.offsets.tolist()
        return (flat[start:stop] for start, stop in zip(offsets[:-1], offsets[1:], strict=True))

    def __add__(self, other: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Like a list's ``+``: the per-client arrays of both, in a list (``client_train + client_test``)."""
        return [*self, *other]

    def __radd__(self, other: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [*other, *self]

    def __repr__(self) -> str:
        return f"Shares({len(self)} clients, {len(self.flat)} indices)"

    def __getstate__(self) -> tuple[np.ndarray, np.ndarray]:
        return self.flat, self.offsets

    def __setstate__(self, state: tuple[np.ndarray, np.ndarray]) -> None:
        self.flat, self.offsets = state
