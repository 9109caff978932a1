"""The run: :class:`Server` drives rounds, each a list of stages (:mod:`fedsim.server.stage`): the built-in
``plan → dispatch → upload → receive → aggregate → commit → measure → evaluate`` (an asynchronous strategy's server
step: ``aggregate → commit → measure → evaluate``), the optional capabilities' stages, and your own
(:class:`RoundStage`, added with ``Stages(extra=[...])`` or ``round.extra``), each reading and extending the round's
:class:`RoundRecord`. The server holds its parts once (:class:`~fedsim.server.parts.RoundParts`), its checkpoints
in :class:`~fedsim.server.checkpointing.RunCheckpoints`. The server knows every package below it and none knows
the server."""

from fedsim.core.errors import ClientMisuseError, RoundFailedError, StrategyError
from fedsim.server.record import RoundRecord
from fedsim.server.server import RunResult, Server
from fedsim.server.settings import Checkpoints, Evaluation, Federation, Schedule, Stages
from fedsim.server.stage import ASYNC_STAGES, CLOCK, FACTS, SYNC_STAGES, UPDATES, RoundStage

__all__ = [
    "ASYNC_STAGES",
    "CLOCK",
    "FACTS",
    "SYNC_STAGES",
    "UPDATES",
    "Checkpoints",
    "ClientMisuseError",
    "Evaluation",
    "Federation",
    "RoundFailedError",
    "RoundRecord",
    "RoundStage",
    "RunResult",
    "Schedule",
    "Server",
    "Stages",
    "StrategyError",
]
