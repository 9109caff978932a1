"""The strategy's output, checked before anything uses it: one line naming the strategy, never a client blamed."""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from typing import Any

import torch

from fedsim.core.errors import StrategyError
from fedsim.core.types import ClientUpdate
from fedsim.observe.run_logger import RunLogger
from fedsim.server.round_metrics import strategy_client_values, strategy_scalars
from fedsim.strategy.base import Strategy


def checked_aggregate(
    strategy: Strategy, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate], logger: RunLogger
) -> torch.Tensor:
    """The strategy's new global weights, cast to the global model's dtype (a rule may compute in float64). A
    strategy that raises or returns something unusable (not a tensor, wrong shape, not floating point, NaN/inf
    after the cast) stops the run with a :class:`StrategyError` naming it; the caller's model
    stays the previous round's. A ``ValueError`` is the strategy refusing the round (e.g. too few updates for
    a robust rule); any other exception is a bug, whose traceback goes to the log and TensorBoard."""
    name = type(strategy).__name__
    try:
        new = strategy.aggregate(round_num, global_params, updates)
    except ValueError as error:
        raise StrategyError(f"round {round_num}: {name} could not aggregate: {first_line(error)}") from error
    except Exception as error:
        line = f"{name}.aggregate raised {type(error).__name__}: {first_line(error)}"
        logger.log_text("strategy", f"{line}\n{traceback.format_exc()}", round_num)
        raise StrategyError(f"round {round_num}: {line}") from error
    problem = unusable_params(new, global_params)
    if problem is None:
        new = new.to(global_params.dtype)  # a float64 rule's result is cast back; an overflow shows as inf below
        problem = non_finite(new)
    if problem is not None:
        raise StrategyError(
            f"round {round_num}: {name}.aggregate returned {problem}; the model of round {round_num - 1} is kept"
        )
    return new


def checked_scalars(strategy: Strategy, round_num: int) -> dict[str, float]:
    """:meth:`Strategy.round_metrics` named ``strategy/<name>``; a bad name or value is a :class:`StrategyError`."""
    try:
        return strategy_scalars(strategy, round_num)
    except ValueError as error:
        raise StrategyError(f"round {round_num}: {first_line(error)}") from error


def checked_client_values(
    strategy: Strategy, round_num: int, updates: Sequence[ClientUpdate]
) -> dict[int, dict[str, Any]]:
    """:meth:`Strategy.client_metrics` of the clients of ``updates``; a bad id, name or value is a
    :class:`StrategyError`."""
    try:
        return strategy_client_values(strategy, round_num, [u.client_id for u in updates])
    except ValueError as error:
        raise StrategyError(f"round {round_num}: {first_line(error)}") from error


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def unusable_params(new: object, reference: torch.Tensor) -> str | None:
    """Why ``new`` cannot become the global weights (a floating-point tensor of ``reference``'s shape), or ``None``."""
    if not isinstance(new, torch.Tensor):
        return f"a {type(new).__name__}, not a tensor"
    if new.shape != reference.shape:
        return f"shape {tuple(new.shape)} but the global model has {tuple(reference.shape)}"
    if not new.is_floating_point():
        return f"dtype {new.dtype}, not a floating-point dtype"
    return None


def non_finite(new: torch.Tensor) -> str | None:
    """How many NaN/inf values ``new`` holds, or ``None`` when it holds none."""
    if bool(torch.isfinite(new.sum(dtype=torch.float64))):  # any NaN/inf reaches the sum; no model-sized mask
        return None
    bad = int((~torch.isfinite(new)).sum())
    return f"{bad} non-finite values (NaN or inf)" if bad else None
