"""Strategies that break on purpose, importable by ``strategy._target_=failing_strategies.<Name>`` once tests/
is on ``sys.path`` (tests/server/test_strategy_failures.py puts it there, and on ``PYTHONPATH`` for the CLI)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fedsim.core.types import ClientUpdate
from fedsim.strategy import FedAvg
from fedsim.strategy.server_opt import FedOpt


class NaNFedAvg(FedAvg):
    """FedAvg, but from round ``nan_round`` on the new weights hold ``count`` NaNs (and one inf)."""

    def __init__(self, nan_round: int = 2, count: int = 5) -> None:
        self.nan_round, self.count = nan_round, count

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        new = super().aggregate(round_num, global_params, updates)
        if round_num >= self.nan_round:
            new[: self.count - 1] = float("nan")
            new[-1] = float("inf")
        return new


class BadReturnFedAvg(FedAvg):
    """FedAvg whose result is mangled in round ``bad_round``: ``how`` is ``short``, ``float64``, ``int64``, ``huge``
    (overflows float32) or ``list``."""

    def __init__(self, how: str = "short", bad_round: int = 1) -> None:
        self.how, self.bad_round = how, bad_round

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> Any:
        new = super().aggregate(round_num, global_params, updates)
        if round_num != self.bad_round:
            return new
        return {
            "short": lambda: new[:-1],
            "float64": lambda: new.double(),
            "int64": lambda: new.long(),
            "huge": lambda: new.double() * 1e300,
            "list": lambda: new.tolist(),
        }[self.how]()


class FlakyFedAdam(FedOpt):
    """FedAdam that, in round ``fail_round`` (0: never), raises ``error`` *after* updating its moments, so its
    state is already half-way into the failed round when the error escapes."""

    def __init__(self, *, fail_round: int = 0, error: str = "RuntimeError", **kwargs: Any) -> None:
        super().__init__(optimizer="adam", **kwargs)
        self.fail_round, self.error = fail_round, error

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        new = super().aggregate(round_num, global_params, updates)
        if round_num == self.fail_round:
            raise {"RuntimeError": RuntimeError, "ValueError": ValueError}[self.error](
                f"moments updated, then exploded in round {round_num}\n(second line of the message)"
            )
        return new
