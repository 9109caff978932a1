"""Early stopping on the centralized test accuracy: a target to reach, or patience without improvement."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


class EarlyStop:
    """Says when a run should end early, and why.

    ``target_accuracy``: stop once ``eval/accuracy`` reaches it. ``patience``: stop after that many
    evaluations in a row without a new best accuracy. Both ``None``: never stop early. Its state is a
    function of the metric history, so a resumed run rebuilds it with :meth:`replay`.
    """

    def __init__(self, target_accuracy: float | None = None, patience: int | None = None) -> None:
        if target_accuracy is not None and not 0 < target_accuracy <= 1:
            raise ValueError(f"early_stop.target_accuracy must be in (0, 1] or null (got {target_accuracy})")
        if patience is not None and patience < 1:
            raise ValueError(f"early_stop.patience must be >= 1 or null (got {patience})")
        self.target_accuracy, self.patience = target_accuracy, patience
        self.best, self.since_best = -math.inf, 0

    def check(self, record: dict[str, Any]) -> str | None:
        """Feed one round's metrics; the reason to stop after it, or ``None``."""
        accuracy = record.get("eval/accuracy")
        if accuracy is None:
            return None
        if accuracy > self.best:
            self.best, self.since_best = accuracy, 0
        else:
            self.since_best += 1
        if self.target_accuracy is not None and accuracy >= self.target_accuracy:
            return f"reached target accuracy {self.target_accuracy} at round {record['round']} ({accuracy:.4f})"
        if self.patience is not None and self.since_best >= self.patience:
            return f"no better accuracy than {self.best:.4f} in {self.patience} evaluations (round {record['round']})"
        return None

    def replay(self, history: Iterable[dict[str, Any]]) -> None:
        """Rebuild the state from a resumed run's history."""
        for record in history:
            self.check(record)
