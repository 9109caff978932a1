"""What a round works with besides the global weights, as one small object handed to the round's helpers (the
metrics of a round, every-client evaluation, FedBuff's event loop) instead of the :class:`~fedsim.server.Server`:
a helper sees the parts, never the server that owns them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fedsim.attacks.stage import AttackStage
from fedsim.client.base import Client
from fedsim.client.evaluation import ClientEvaluation
from fedsim.client.local_training import LocalTraining
from fedsim.client.state import ClientStateStore
from fedsim.executor.base import Executor
from fedsim.observe.run_logger import RunLogger
from fedsim.privacy.local import LocalLedger
from fedsim.server.exchange import Exchange
from fedsim.strategy.base import Strategy


class Stateful(Protocol):
    """A part of the run with its own entry in the checkpoint (the clock, the exchange's byte ledger, ...)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class RoundParts:
    """The run's collaborators as a round uses them (references, not copies).

    ``client_config(round_num, client_id)``: a task's config (the strategy's, with a straggler's fewer epochs);
    ``local``: the strategy's client half of this run (None before the run starts or when clients train plainly);
    ``local_dp``: DP-SGD clients' privacy ledger; ``attack``: the attack stage (None without an attack)."""

    clients: Sequence[Client]
    executor: Executor
    strategy: Strategy
    comm: Exchange
    attack: AttackStage | None
    local_dp: LocalLedger | None
    client_states: ClientStateStore
    logger: RunLogger
    client_eval: ClientEvaluation
    client_config: Callable[[int, int], dict[str, Any]]
    local: LocalTraining | None
    min_success_fraction: float
    seed: int
