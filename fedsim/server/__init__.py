"""The run: :class:`Server` drives rounds (plan, dispatch, receive, aggregate, commit client state, measure,
evaluate), with FedBuff's server step on the simulated clock as the asynchronous alternative; its helpers get the
round's parts (:class:`~fedsim.server.parts.RoundParts`), never the server. Set-up and resume, central and
every-client evaluation, the guard around a strategy's calls, stragglers and early stopping live here too. The
server knows every package below it and none knows the server."""

from fedsim.core.errors import ClientMisuseError, RoundFailedError, StrategyError
from fedsim.server.server import RunResult, Server
from fedsim.server.settings import Checkpoints, Evaluation, Federation, Schedule, Stages

__all__ = [
    "Checkpoints",
    "ClientMisuseError",
    "Evaluation",
    "Federation",
    "RoundFailedError",
    "RunResult",
    "Schedule",
    "Server",
    "Stages",
    "StrategyError",
]
