"""What a round adds to its metrics and client rows beyond training: bytes, local DP's spent privacy, the attack."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fedsim.core.types import ClientUpdate, TaskResult

if TYPE_CHECKING:
    from fedsim.server.parts import RoundParts


def row_extras(parts: RoundParts, round_num: int, client_id: int, config: dict[str, Any]) -> dict[str, Any]:
    """A client row's bytes each way (``config``: its task's) and, in an attacked run, whether the client is
    malicious."""
    extras: dict[str, Any] = {"bytes_down": parts.comm.task_down_bytes(config), "bytes_up": parts.comm.up_bytes}
    if parts.attack is not None:
        extras["malicious"] = client_id in parts.attack.malicious(round_num)
    return extras


def async_row_extras(parts: RoundParts, round_num: int, client_id: int) -> dict[str, Any]:
    """An asynchronous server step's client row: its upload's bytes (its download belongs to the step that started
    it) and, in an attacked run, whether the client is malicious in this step."""
    extras: dict[str, Any] = {"bytes_up": parts.comm.up_bytes}
    if parts.attack is not None:
        extras["malicious"] = client_id in parts.attack.malicious(round_num)
    return extras


def wire_metrics(parts: RoundParts, down: int, results: Sequence[TaskResult]) -> dict[str, float]:
    """The round's ``comm/`` bytes (``down``: downloaded by the round's clients) and, with DP-SGD clients, their
    spent privacy (every update that came back was released, accepted or not)."""
    metrics = parts.comm.round_metrics(down, results)
    if parts.local_dp is not None:
        metrics |= parts.local_dp.record([r for r in results if isinstance(r, ClientUpdate)])
    return metrics


def attack_metrics(
    parts: RoundParts, round_num: int, client_ids: Sequence[int], kept: Sequence[ClientUpdate]
) -> dict[str, float]:
    """The round's ``attack/`` counts (empty without an attack); a rule that selects updates (Krum) says which."""
    if parts.attack is None:
        return {}
    return parts.attack.round_metrics(round_num, client_ids, kept, getattr(parts.strategy, "selected_client_ids", None))
