"""The number a Hydra sweeper optimises: one metric of the run, reduced over its rounds.

``python -m fedsim`` returns it from its Hydra task function, so that sweepers that search (Optuna, Ax,
Nevergrad) need no code of the user's. Configured by ``objective.metric`` (any scalar of ``metrics.jsonl``,
default ``eval/accuracy``) and ``objective.reduce``: ``final`` (its value in the last round that logged
it), ``max`` or ``min`` (over all rounds). Whether larger is better is the sweeper's setting (Optuna's
``direction: maximize`` for accuracy, ``minimize`` for a loss), see docs/experiments-and-sweeps.md.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("fedsim")

REDUCTIONS = ("final", "max", "min")
METRIC_NAME = re.compile(r"[A-Za-z0-9_.\-/]+")  # as fedsim.server.round_metrics.NAME


def objective_value(history: Sequence[dict[str, Any]], metric: str, reduce: str) -> float:
    """``metric`` over the rounds of ``history`` reduced by ``reduce``; NaN (and a warning) when no round logged
    it: a sweeper counts NaN as a failed trial rather than as a good or bad value."""
    values = [float(r[metric]) for r in history if _is_number(r.get(metric))]
    if not values:
        log.warning("objective: no round logged %s; returning NaN (set objective.metric to a logged scalar)", metric)
        return math.nan
    if reduce == "final":
        return values[-1]
    return max(values) if reduce == "max" else min(values)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
