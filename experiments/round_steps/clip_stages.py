"""Round steps of a researcher's own, outside fedsim (docs/writing-a-round-step.md).

Run from this folder (or with it on PYTHONPATH):

    python -m fedsim 'round.extra=[{_target_: clip_stages.ClipAggregate, max_norm: 1.0}]'
    python -m fedsim 'round.extra=[{_target_: clip_stages.AdaptiveClip}]' checkpoint_every=1

``ClipAggregate`` clips the round's aggregated update to an L2 norm and reports the norm before clipping;
``AdaptiveClip`` keeps its bound as state and moves it towards a quantile of the norms it sees (the geometric rule
of Andrew, Thakkar, McMahan and Ramaswamy, "Differentially Private Learning with Adaptive Clipping", NeurIPS 2021,
here on the server's aggregate); its state is in every checkpoint, so a resumed run continues it exactly.
"""

from __future__ import annotations

import math
from typing import Any

from fedsim.server import RoundRecord, RoundStage


class ClipAggregate(RoundStage):
    """After aggregation: the aggregated update Δ = new − old global weights, clipped to ``max_norm``."""

    name = "clip"
    position = "after aggregate"
    needs = frozenset()  # reads only the aggregate (record.params), never a client's update: runs under dp=central

    def __init__(self, max_norm: float = 1.0) -> None:
        if not max_norm > 0:
            raise ValueError(f"round.extra: ClipAggregate max_norm must be > 0 (got {max_norm})")
        self.max_norm = float(max_norm)

    def run(self, record: RoundRecord) -> dict[str, float]:
        delta = record.params - record.start_params
        norm = float(delta.norm())
        if norm > self.max_norm:
            record.params = record.start_params + delta * (self.max_norm / norm)
        return {"pre_clip_norm": norm, "clipped": float(norm > self.max_norm)}


class UndeclaredClipAggregate(ClipAggregate):
    """The same stage without its declaration: fedsim takes it to read the individual updates."""

    needs = None


class AdaptiveClip(RoundStage):
    """``ClipAggregate`` with a bound that follows the ``quantile`` of the aggregate norms it has seen: after each
    round, bound ← bound · exp(−lr · (1[norm ≤ bound] − quantile)). The bound is the stage's state."""

    name = "adaptive_clip"
    position = "after aggregate"
    needs = frozenset()

    def __init__(self, initial: float = 1.0, quantile: float = 0.5, lr: float = 0.2) -> None:
        self.bound, self.quantile, self.lr = float(initial), float(quantile), float(lr)

    def run(self, record: RoundRecord) -> dict[str, float]:
        delta = record.params - record.start_params
        norm, bound = float(delta.norm()), self.bound
        if norm > bound:
            record.params = record.start_params + delta * (bound / norm)
        self.bound = bound * math.exp(-self.lr * (float(norm <= bound) - self.quantile))
        return {"pre_clip_norm": norm, "bound": bound}

    def state_dict(self) -> dict[str, Any]:
        return {"bound": self.bound}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.bound = float(state["bound"])
