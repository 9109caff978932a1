"""What crosses the wire each way: a direction's chain of codecs, and the run's compression settings.

Downlink: the round's global weights are encoded once (one broadcast, seeded by (seed, round)); every sampled client
trains from the decoded weights. Only value codecs (casts, QSGD) apply there: a sparsifier would zero most weights.

Uplink: a client sends its update Δ = trained weights − the weights it received. The chain sparsifies Δ, encodes the
values left, and the server rebuilds the update the strategy aggregates as its own global weights + decoded Δ.
With ``error_feedback`` the client adds to Δ what earlier encodings lost (its residual) and keeps the new loss,
e = (Δ + e) − decoded, as client state (Stich et al., NeurIPS 2018; the residual is committed only with an accepted
update, like all client state).

Encodings are pure functions of the update, the residual and a generator seeded from (seed, round, client,
direction), so they are the same wherever the task ran. The server applies them when a result arrives
(:mod:`fedsim.server.exchange`), before the update checks and aggregation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fedsim.comm.codecs import FLOAT32_BYTES, Sparsifier, ValueCodec

Codec = Sparsifier | ValueCodec


@dataclass(frozen=True)
class Chain:
    """Sparsifiers in order, then at most one value codec; empty: float32 as is."""

    sparsifiers: tuple[Sparsifier, ...] = ()
    coder: ValueCodec | None = None

    @classmethod
    def of(cls, codecs: Sequence[Codec], field: str) -> Chain:
        """The chain of ``codecs`` as configured under ``field``; a ``ValueError`` naming the entry otherwise."""
        sparsifiers: list[Sparsifier] = []
        coder: ValueCodec | None = None
        for i, codec in enumerate(codecs):
            where = f"{field}[{i}]"
            if isinstance(codec, Sparsifier):
                if coder is not None:
                    raise ValueError(f"{where}: {codec!r} comes after the value codec {coder!r}; put sparsifiers first")
                sparsifiers.append(codec)
            elif isinstance(codec, ValueCodec):
                if coder is not None:
                    raise ValueError(
                        f"{where}: {codec!r} is a second value codec after {coder!r}; a chain encodes its values once"
                    )
                coder = codec
            else:
                raise ValueError(
                    f"{where}: a {type(codec).__name__} is neither a fedsim.comm.Sparsifier "
                    "nor a fedsim.comm.ValueCodec"
                )
        return cls(tuple(sparsifiers), coder)

    @property
    def lossless(self) -> bool:
        """True for the empty chain: the vector goes as float32, unchanged."""
        return not self.sparsifiers and self.coder is None

    def nbytes(self, n: int) -> int:
        """The bytes that encode an ``n``-vector (the same for every vector of that length)."""
        side = 0
        for sparsifier in self.sparsifiers:
            side += sparsifier.side_bytes(n)
            n = sparsifier.kept(n)
        return side + (self.coder.nbytes(n) if self.coder is not None else FLOAT32_BYTES * n)

    def apply(self, vector: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """What the receiver decodes from ``vector`` (1-D float32): dense, float32, the same length."""
        positions: torch.Tensor | None = None
        values, scale = vector, 1.0
        for sparsifier in self.sparsifiers:
            selection = sparsifier.select(values, generator)
            values, scale = values[selection.positions], scale * selection.scale
            positions = selection.positions if positions is None else positions[selection.positions]
        decoded = self.coder.code(values, generator) if self.coder is not None else values
        if scale != 1.0:
            decoded = decoded * scale
        if positions is None:
            return decoded
        dense = torch.zeros_like(vector)
        dense[positions] = decoded
        return dense

    def __str__(self) -> str:
        parts = [repr(c) for c in (*self.sparsifiers, *([self.coder] if self.coder is not None else []))]
        return " > ".join(parts) if parts else "float32"


class Compression:
    """The run's codecs each way; ``Compression()`` sends float32 both ways and changes nothing."""

    def __init__(
        self, *, uplink: Sequence[Codec] = (), downlink: Sequence[Codec] = (), error_feedback: bool = False
    ) -> None:
        self.uplink = Chain.of(uplink, "compression.uplink")
        self.downlink = Chain.of(downlink, "compression.downlink")
        if self.downlink.sparsifiers:
            raise ValueError(
                f"compression.downlink: {self.downlink.sparsifiers[0]!r} would sparsify the global model's "
                "weights themselves; only value codecs (fp16, bf16, qsgd) apply to the downlink"
            )
        if not isinstance(error_feedback, bool):
            raise ValueError(f"compression.error_feedback must be true or false (got {error_feedback!r})")
        if error_feedback and self.uplink.lossless:
            raise ValueError(
                "compression.error_feedback=true needs a lossy compression.uplink (e.g. [topk]): "
                "float32 updates lose nothing to feed back"
            )
        self.error_feedback = error_feedback

    @property
    def lossless(self) -> bool:
        return self.uplink.lossless and self.downlink.lossless

    def __repr__(self) -> str:
        feedback = ", error feedback" if self.error_feedback else ""
        return f"Compression(uplink={self.uplink}{feedback}; downlink={self.downlink})"
