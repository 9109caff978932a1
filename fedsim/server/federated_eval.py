"""The server's federated evaluation: the clients' scores on their local test splits, through the executor."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from fedsim.client.evaluation import eval_tasks, summary
from fedsim.client.local_training import personalises
from fedsim.core.progress import progress
from fedsim.core.types import ClientFailure, ClientScore, EvalResult, EvalTask
from fedsim.server.exchange import task_state

if TYPE_CHECKING:
    import torch

    from fedsim.server.parts import RoundParts


def evaluate_clients(
    parts: RoundParts, params: torch.Tensor, round_num: int, sampled: Sequence[int]
) -> dict[str, float]:
    """Federated evaluation (see :mod:`fedsim.client.evaluation`): the clients that ``evaluate_clients`` names
    (``sampled``: this round's) scored on their local test splits with the global model and, if the algorithm has
    them, their personal models; their distribution as metrics, each client's values in
    ``client_eval/round-<NNNN>.csv``. Empty when none of them holds test data. Personal models come from the clients'
    states (without what only the update encoder reads, e.g. an error-feedback residual)."""
    personal = personalises(parts.local)
    ids = parts.client_eval.clients(sampled, len(parts.clients), parts.seed)
    states = (lambda cid: task_state(parts.client_states.get(cid))) if personal else None
    tasks = eval_tasks(round_num, ids, parts.clients, states)
    if not tasks:
        return {}
    scores: list[ClientScore] = []
    failed = 0
    for result in _results(parts, params, tasks):
        if isinstance(result, ClientFailure):
            parts.logger.log_text("client_eval/failure", f"{result.error}\n{result.traceback}", round_num)
            failed += 1
        else:
            scores.extend(result.scores)
    parts.logger.log_client_scores(round_num, scores, personal)
    return summary(scores, personal) | ({"eval_global/failed_tasks": float(failed)} if failed else {})


TASKS_PER_CALL = 64
"""Evaluation tasks handed to the executor at once when there are more: the progress shows after each call."""


def _results(parts: RoundParts, params: torch.Tensor, tasks: list[EvalTask]) -> Iterator[EvalResult | ClientFailure]:
    """The executor's results of ``tasks``, :data:`TASKS_PER_CALL` tasks a call, with the clients scored so far
    as progress (:mod:`fedsim.core.progress`). The tasks are in client order and results come back sorted by
    client, so the calls' results, one after the other, are what one call would return."""
    clients = sum(len(task.client_ids) for task in tasks)
    with progress(f"scoring {clients:,} clients", clients, "client") as advance:
        for start in range(0, len(tasks), TASKS_PER_CALL):
            batch = tasks[start : start + TASKS_PER_CALL]
            yield from parts.executor.evaluate(params, batch)
            advance(sum(len(task.client_ids) for task in batch))
