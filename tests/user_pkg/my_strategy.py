"""A strategy that lives outside the fedsim package, plugged in with ``strategy._target_=my_strategy.KeepGlobal``.

The CLI tests put this folder on ``PYTHONPATH``. ``KeepGlobal`` ignores the clients' weights and keeps
the global model, so every evaluation of a run equals the first one; with ``marker`` set it also
appends one line per aggregation (round, client ids, examples) to that file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from fedsim.core.types import ClientUpdate
from fedsim.strategy import Strategy


class KeepGlobal(Strategy):
    """Returns the global parameters unchanged (and records each call in ``marker``, if given)."""

    def __init__(self, marker: str | None = None) -> None:
        self.marker = Path(marker) if marker else None

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        if self.marker is not None:
            ids = ",".join(str(u.client_id) for u in updates)
            examples = sum(u.num_examples for u in updates)
            with open(self.marker, "a", encoding="utf-8") as f:
                f.write(f"round={round_num} clients={ids} examples={examples}\n")
        return global_params.clone()
