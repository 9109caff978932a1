"""What of a round's results may reach aggregation: the failure policy, then every update checked against the
global model."""

from __future__ import annotations

import torch

from fedsim.errors import ClientMisuseError, RoundFailedError
from fedsim.logging import RunLogger
from fedsim.types import ClientFailure, ClientUpdate, TaskResult


def apply_failure_policy(round_num: int, results: list[TaskResult], min_success_fraction: float, logger: RunLogger) -> list[ClientUpdate]:
    """The round's updates, once every failure is logged; :class:`RoundFailedError` when fewer than
    ``min_success_fraction`` of the clients succeeded, :class:`ClientMisuseError` on any fatal failure (a
    misuse that would make results depend on the executor is never tolerated)."""
    if not results:  # the simulated clock dropped every sampled client: nothing failed
        return []
    updates = [r for r in results if isinstance(r, ClientUpdate)]
    failures = [r for r in results if isinstance(r, ClientFailure)]
    fatal = next((f for f in failures if f.fatal), None)
    if fatal is not None:
        raise ClientMisuseError(f"round {round_num}: {fatal.error}")
    for failure in failures:
        logger.log_text("failures", f"client {failure.client_id} (worker {failure.worker}): {failure.error}\n{failure.traceback}", round_num)
    if not updates or len(updates) < min_success_fraction * len(results):
        first = failures[0]
        raise RoundFailedError(
            f"round {round_num}: {len(failures)} of {len(results)} clients failed "
            f"(min_success_fraction={min_success_fraction}); first: client {first.client_id}: {first.error}"
        )
    return updates


def sound_updates(round_num: int, updates: list[ClientUpdate], global_params: torch.Tensor, logger: RunLogger) -> list[ClientUpdate]:
    """Drop (and log) updates that do not fit the global model (shape, dtype, non-finite values, bad counts)."""
    sound = []
    for update in updates:
        reason = rejection_reason(update, global_params)
        if reason is None:
            sound.append(update)
        else:
            logger.log_text("rejected", f"client {update.client_id}: {reason}", round_num)
    return sound


def rejection_reason(update: ClientUpdate, global_params: torch.Tensor) -> str | None:
    """Why ``update`` must not be aggregated, or ``None`` when it is sound.

    Flat vectors stand for the model's state in a fixed key order, so "same keys and shapes" reduces
    to the same length; the dtype must match and every value be finite; the example count positive.
    """
    params = update.params
    if not isinstance(params, torch.Tensor):
        return f"params is a {type(params).__name__}, not a tensor"
    if params.shape != global_params.shape:
        return f"params has shape {tuple(params.shape)} but the global model has {tuple(global_params.shape)}"
    if params.dtype != global_params.dtype:
        return f"params has dtype {params.dtype} but the global model has {global_params.dtype}"
    if not _all_finite(params):
        bad = int((~torch.isfinite(params)).sum())
        return f"params has {bad} non-finite values (NaN or inf)"
    if not isinstance(update.num_examples, int) or update.num_examples <= 0:
        return f"num_examples must be a positive integer (got {update.num_examples!r})"
    return None


def _all_finite(params: torch.Tensor) -> bool:
    """``isfinite(params).all()``; for float32 and narrower as a float64 sum, which no finite values can
    overflow and any NaN or inf reaches, so no boolean tensor as large as the model is allocated."""
    if params.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return bool(torch.isfinite(params.sum(dtype=torch.float64)))
    return bool(torch.isfinite(params).all())
