"""What a run works with besides the global weights, held once: the one bag of parts the server, its round's stages
and their helpers (every-client evaluation, FedBuff's event loop, checkpointing) share. A helper sees the parts,
never the server that owns them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsim.attacks.stage import AttackStage
from fedsim.client.base import Client
from fedsim.client.evaluation import ClientEvaluation
from fedsim.client.local_training import LocalTraining
from fedsim.client.schedule import scheduled_config
from fedsim.client.state import ClientStateStore
from fedsim.data.tensor_data import TensorData
from fedsim.executor.base import Executor
from fedsim.observe.run_logger import RunLogger
from fedsim.privacy.local import LocalLedger
from fedsim.privacy.rounds import PrivateRounds
from fedsim.server.central_eval import DeviceEvaluator
from fedsim.server.exchange import Exchange
from fedsim.server.settings import Evaluation, Schedule
from fedsim.server.stragglers import Stragglers
from fedsim.sim.clock import SyncClock
from fedsim.strategy.base import Strategy


@dataclass
class RoundParts:
    """The run's collaborators (references, not copies), built once by :func:`fedsim.server.setup.build_parts`.

    ``clients`` and ``train_data``: the federation as the run trains it (a data attack's poisoned copies replace the
    malicious clients' own); ``clean_clients``: the clients before that (the root data's pool); ``schedule`` and
    ``evaluation``: the server's setting groups. The optional capabilities are ``None`` when not used: ``clock``
    (simulated time), ``privacy`` (central DP), ``attack``, ``local_dp`` (DP-SGD clients' privacy ledger).
    ``local``: the strategy's client half of this run, set when the run starts (``None`` before, or when clients
    train plainly); ``checkpoint_dir``: where checkpoints go (``None``: nowhere)."""

    clients: Sequence[Client]
    clean_clients: Sequence[Client]
    train_data: TensorData
    test_data: TensorData | None
    executor: Executor
    strategy: Strategy
    comm: Exchange
    client_states: ClientStateStore
    logger: RunLogger
    evaluator: DeviceEvaluator
    schedule: Schedule
    evaluation: Evaluation
    stragglers: Stragglers
    seed: int
    clock: SyncClock | None = None
    privacy: PrivateRounds | None = None
    attack: AttackStage | None = None
    local_dp: LocalLedger | None = None
    local: LocalTraining | None = None
    checkpoint_dir: Path | None = None

    @property
    def min_success_fraction(self) -> float:
        """The share of a round's clients that must succeed for it to aggregate."""
        return self.schedule.min_success_fraction

    @property
    def client_eval(self) -> ClientEvaluation:
        """Who is scored on their local test splits, and how often."""
        return self.evaluation.clients

    def client_config(self, round_num: int, client_id: int, *, lr_round: int | None = None) -> dict[str, Any]:
        """A task's config: the strategy's, with fewer epochs (or local steps) for a simulated straggler and the
        round's learning rate when the client has a schedule (:mod:`fedsim.client.schedule`; ``lr_round``: the round
        it is read at, ``round_num`` unless given: FedBuff's tasks read it at their start version + 1)."""
        config = self.strategy.client_config(round_num, client_id)
        client = self.clients[client_id]
        unit, full = self._work(config, client)
        done = self.stragglers.work_for(round_num, client_id, full)
        config = config if done is None else {**config, unit: done}
        return scheduled_config(client, config, round_num if lr_round is None else lr_round, self.schedule.num_rounds)

    def straggles(self, round_num: int, client_id: int) -> bool:
        """Whether the client is one of the round's simulated stragglers (told to do less than its full work)."""
        full = self._work(self.strategy.client_config(round_num, client_id), self.clients[client_id])[1]
        return self.stragglers.work_for(round_num, client_id, full) is not None

    def _work(self, config: dict[str, Any], client: Client) -> tuple[str, int]:
        """The config key of a task's amount of work and its full value: ``local_steps`` K when the round or the client
        sets them, else ``epochs`` E (``stragglers.epochs``)."""
        steps = config.get("local_steps", getattr(client, "local_steps", None))
        return ("epochs", self.stragglers.epochs) if steps is None else ("local_steps", int(steps))
