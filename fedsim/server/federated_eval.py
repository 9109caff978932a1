"""The server's federated evaluation: the clients' scores on their local test splits, through the executor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from fedsim.client.evaluation import eval_tasks, summary
from fedsim.client.local_training import personalises
from fedsim.core.types import ClientFailure
from fedsim.server.exchange import task_state

if TYPE_CHECKING:
    from fedsim.server.server import Server


def evaluate_clients(server: Server, round_num: int, sampled: Sequence[int]) -> dict[str, float]:
    """Federated evaluation (see :mod:`fedsim.client.evaluation`): the clients that ``evaluate_clients`` names (``sampled``:
    this round's) scored on their local test splits with the global model and, if the algorithm has them, their
    personal models; their distribution as metrics, each client's values in ``client_eval/round-<NNNN>.csv``. Empty
    when none of them holds test data. Personal models come from the clients' states (without what only the update
    encoder reads, e.g. an error-feedback residual)."""
    personal = personalises(server.local)
    ids = server.client_eval.clients(sampled, len(server.clients), server.seed)
    states = (lambda cid: task_state(server.client_states.get(cid))) if personal else None
    tasks = eval_tasks(round_num, ids, server.clients, states)
    if not tasks:
        return {}
    scores, failed = [], 0
    for result in server.executor.evaluate(server.params, tasks):
        if isinstance(result, ClientFailure):
            server.logger.log_text("client_eval/failure", f"{result.error}\n{result.traceback}", round_num)
            failed += 1
        else:
            scores.extend(result.scores)
    server.logger.log_client_scores(round_num, scores, personal)
    return summary(scores, personal) | ({"eval_global/failed_tasks": float(failed)} if failed else {})
