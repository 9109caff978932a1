"""The groups a :class:`~fedsim.server.Server` is built from, besides the model factory, the strategy, the executor,
the seed and the logger: who takes part (:class:`Federation`), how the rounds run (:class:`Schedule`), what is
evaluated when (:class:`Evaluation`), where checkpoints go (:class:`Checkpoints`) and the optional stages of a round
(:class:`Stages`: stragglers, the simulated clock, codecs, central DP, an attack). Plain frozen records: the server
checks their values when it is built, with one line naming the setting."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fedsim.attacks.base import Attack
from fedsim.client.base import Client
from fedsim.client.evaluation import ClientEvaluation
from fedsim.comm.pipeline import Compression
from fedsim.data.tensor_data import TensorData
from fedsim.privacy.central import CentralDP
from fedsim.server.early_stop import EarlyStop
from fedsim.server.stage import RoundStage
from fedsim.server.stragglers import Stragglers
from fedsim.sim.clock import SyncClock


@dataclass(frozen=True)
class Federation:
    """The clients (client ``i`` at index ``i``), the shared training data they index, the centralized test set
    (``None``: no central evaluation) and where the clients' states live between rounds: ``"memory"``, or
    ``"disk"`` for very many clients (:mod:`fedsim.client.state`; with checkpoints, under
    ``<checkpoints.dir>/client_state``)."""

    clients: Sequence[Client]
    train_data: TensorData
    test_data: TensorData | None
    state_store: str = "memory"


@dataclass(frozen=True)
class Schedule:
    """``num_rounds`` rounds of ``clients_per_round`` sampled clients. A round aggregates when at least
    ``min_success_fraction`` of its clients succeeded, otherwise the run stops with
    :class:`~fedsim.core.errors.RoundFailedError`; ``early_stop`` may end the run sooner. ``threads``: torch's thread
    count in the server's process during :meth:`~fedsim.server.Server.run`, outside the executor's training
    (``None``: unchanged; :mod:`fedsim.core.threads`); the caller's setting comes back afterwards."""

    num_rounds: int
    clients_per_round: int
    min_success_fraction: float = 1.0
    early_stop: EarlyStop | None = None
    threads: int | None = 1


@dataclass(frozen=True)
class Evaluation:
    """The centralized test set is evaluated every ``every`` rounds and after the last one, on ``device``
    (``"auto"``: the first GPU if there is one; :mod:`fedsim.server.central_eval`); ``clients`` says which clients
    are scored on their local test splits, and how often (:mod:`fedsim.client.evaluation`)."""

    every: int = 1
    device: str = "auto"
    clients: ClientEvaluation = field(default_factory=ClientEvaluation)


@dataclass(frozen=True)
class Checkpoints:
    """Checkpoints go to ``dir``: every ``every`` rounds (0: only at the end, on a requested stop, and the last good
    round's after an error), the newest ``keep`` kept."""

    dir: str | Path
    every: int = 0
    keep: int = 3


@dataclass(frozen=True)
class Stages:
    """The optional stages of a round, each ``None`` when not used. ``stragglers``: clients that manage fewer local
    epochs (the strategy decides whether their work counts); ``clock``: simulated time (deadlines, availability,
    FedBuff; :mod:`fedsim.sim`); ``compression``: the codecs of each direction (:mod:`fedsim.comm`; default float32
    both ways, and every round reports its ``comm/`` bytes); ``privacy``: DP-FedAvg (:mod:`fedsim.privacy`): Poisson
    sampling, a noisy mean update, ε every round; ``attack``: malicious clients (:mod:`fedsim.attacks`), never
    revealed to the strategy; ``extra``: stages of your own, each at its position
    (:class:`~fedsim.server.stage.RoundStage`, docs/writing-a-round-step.md)."""

    stragglers: Stragglers | None = None
    clock: SyncClock | None = None
    compression: Compression | None = None
    privacy: CentralDP | None = None
    attack: Attack | None = None
    extra: Sequence[RoundStage] = ()


# the keyword arguments Server took before they were grouped, and where each went (a one-line TypeError names it)
MOVED = {
    **dict.fromkeys(("clients", "train_data", "test_data", "state_store"), "federation=Federation(...)"),
    **dict.fromkeys(
        ("num_rounds", "clients_per_round", "min_success_fraction", "early_stop", "threads"), "schedule=Schedule(...)"
    ),
    "eval_every": "evaluation=Evaluation(every=...)",
    "eval_device": "evaluation=Evaluation(device=...)",
    "client_eval": "evaluation=Evaluation(clients=...)",
    "checkpoint_dir": "checkpoints=Checkpoints(dir=...)",
    "checkpoint_every": "checkpoints=Checkpoints(every=...)",
    "keep_checkpoints": "checkpoints=Checkpoints(keep=...)",
    **dict.fromkeys(("stragglers", "clock", "compression", "privacy", "attack"), "stages=Stages(...)"),
}


def refuse_moved(kwargs: dict[str, object]) -> None:
    """Refuse, in one line naming where each went, the keyword arguments of the ungrouped ``Server`` constructor."""
    moved = [name for name in kwargs if name in MOVED]
    if moved:
        where = "; ".join(f"{name} -> {MOVED[name]}" for name in moved)
        raise TypeError(
            f"Server no longer takes {', '.join(moved)}: they moved into groups ({where}; "
            "from fedsim.server.settings, also importable from fedsim; docs/python-api.md)"
        )
