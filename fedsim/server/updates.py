"""What of a round's results may reach aggregation: the failure policy, then every update checked against the
global model."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedsim.core.errors import ClientMisuseError, RoundFailedError
from fedsim.core.types import ClientFailure, ClientUpdate, TaskResult
from fedsim.core.update_checks import rejection_reason
from fedsim.observe.run_logger import RunLogger


def apply_failure_policy(
    round_num: int, results: Sequence[TaskResult], min_success_fraction: float, logger: RunLogger
) -> list[ClientUpdate]:
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
        logger.log_text(
            "failures",
            f"client {failure.client_id} (worker {failure.worker}): {failure.error}\n{failure.traceback}",
            round_num,
        )
    if not updates or len(updates) < min_success_fraction * len(results):
        first = failures[0]
        raise RoundFailedError(
            f"round {round_num}: {len(failures)} of {len(results)} clients failed "
            f"(min_success_fraction={min_success_fraction}); first: client {first.client_id}: {first.error}"
        )
    return updates


def sound_updates(
    round_num: int, updates: list[ClientUpdate], global_params: torch.Tensor, logger: RunLogger
) -> list[ClientUpdate]:
    """Drop (and log) updates that do not fit the global model (shape, dtype, non-finite values, bad counts)."""
    sound = []
    for update in updates:
        reason = rejection_reason(update, global_params)
        if reason is None:
            sound.append(update)
        else:
            logger.log_text("rejected", f"client {update.client_id}: {reason}", round_num)
    return sound
