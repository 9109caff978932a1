"""Running one :class:`~fedsim.core.types.EvalTask` on a worker: a group of clients scored on their local test splits.

The global model scores the whole group in one pass over the concatenation of its clients' test examples (in the
group's order, in batches of :data:`EVAL_BATCH` rows), which costs about what one centralized pass over the same
examples costs; each client's loss is its examples' losses summed in float64. A group is formed from the task
alone, so the rows, their batches and the sums are the same under every executor: results agree bit for bit
(with the same ``threads``). Clients whose class overrides :meth:`~fedsim.client.base.Client.evaluate` (or a group
of mixed classes) are scored one by one with their own ``evaluate``.

With personal models (the strategy's client half overrides
:meth:`~fedsim.client.local_training.LocalTraining.personalise`), each client that has personal state is scored once
more with the global weights plus its personal parts; one that has none scores as the global model does.

On token data (labels ``[N, T]``) the scores are :class:`~fedsim.client.evaluation.TokenScore`: the summary adds the
clients' perplexities.
"""

from __future__ import annotations

import math
import traceback as tb
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsim.client.base import Client
from fedsim.client.evaluation import TokenScore
from fedsim.client.local_training import LocalTraining, personalises
from fedsim.client.scoring import example_losses
from fedsim.core.params import load_flat, restore_fixed_state
from fedsim.core.types import ClientFailure, ClientScore, EvalResult, EvalTask
from fedsim.data.tensor_data import TensorData

EVAL_BATCH = 1024  # rows per forward pass when scoring a group


def run_eval_task(
    model: nn.Module,
    clients: Sequence[Client],
    data: TensorData,
    global_params: torch.Tensor,
    task: EvalTask,
    worker: str,
    local: LocalTraining | None = None,
    fixed: dict[str, torch.Tensor] | None = None,
) -> EvalResult | ClientFailure:
    """Score ``task``'s clients with ``global_params`` (and their personal models); an exception in client or
    strategy code becomes a :class:`ClientFailure` for the group, naming its clients."""
    try:
        members = [clients[cid] for cid in task.client_ids]
        _load(model, global_params, fixed)
        scores = _group_scores(model, members, data)
        if personalises(local) and task.states:
            assert local is not None
            scores = [
                _with_personal(model, client, data, global_params, fixed, local, state, score)
                for client, state, score in zip(members, task.states, scores, strict=True)
            ]
        return EvalResult(client_id=task.client_id, round_num=task.round_num, scores=tuple(scores), worker=worker)
    except Exception as error:  # noqa: BLE001 - client code may raise anything; it becomes data
        who = f"evaluating clients {task.client_ids[0]}..{task.client_ids[-1]}"
        return ClientFailure(
            client_id=task.client_id,
            round_num=task.round_num,
            error=f"{who}: {type(error).__name__}: {error}",
            traceback=tb.format_exc(),
            worker=worker,
        )


def _load(model: nn.Module, params: torch.Tensor, fixed: dict[str, torch.Tensor] | None) -> None:
    if fixed:
        restore_fixed_state(model, fixed)
    load_flat(model, params)


def _group_scores(model: nn.Module, members: list[Client], data: TensorData) -> list[ClientScore]:
    """Every member's score with the model as loaded: one concatenated pass when they share the built-in
    evaluation, else each client's own :meth:`~fedsim.client.base.Client.evaluate`."""
    if not _shared_evaluation(members):
        return [_own_score(model, client, data) for client in members]
    sizes = [int(c.test_indices.size) for c in members]
    rows = torch.from_numpy(np.concatenate([c.test_indices for c in members]))
    losses, correct = example_losses(members[0], model, data, rows, batch_size=EVAL_BATCH)
    # per-client sums in one pass (float64, each client's examples added in order): ~12 µs per client less than
    # slicing, which made scoring 1,000 small clients 1.7x a centralized pass instead of 1.1x (docs/performance.md)
    owner = np.repeat(np.arange(len(members)), sizes)
    loss_sums = np.bincount(owner, weights=losses.double().numpy(), minlength=len(members)).tolist()
    hits = np.bincount(owner, weights=correct.numpy(), minlength=len(members)).tolist()
    score = _score_type(data)
    return [
        score(c.client_id, n, s / n, h / n) if n else score(c.client_id, 0, math.nan, math.nan)  # h: a float sum
        for c, n, s, h in zip(members, sizes, loss_sums, hits, strict=True)
    ]


def _score_type(data: TensorData) -> type[ClientScore]:
    """:class:`TokenScore` for token labels ``[N, T]`` (the summary adds perplexities), else ``ClientScore``."""
    return TokenScore if data.y.ndim == 2 else ClientScore


def _shared_evaluation(members: list[Client]) -> bool:
    """Whether one pass can score every member: one class, whose ``evaluate`` is the built-in one."""
    kinds = {type(c) for c in members}
    return len(kinds) == 1 and next(iter(kinds)).evaluate is Client.evaluate


def _own_score(model: nn.Module, client: Client, data: TensorData) -> ClientScore:
    result = client.evaluate(model, data)
    score = _score_type(data)
    return score(client.client_id, int(result["num_examples"]), float(result["loss"]), float(result["accuracy"]))


def _with_personal(
    model: nn.Module,
    client: Client,
    data: TensorData,
    global_params: torch.Tensor,
    fixed: dict[str, torch.Tensor] | None,
    local: LocalTraining,
    state: dict[str, Any],
    score: ClientScore,
) -> ClientScore:
    """``score`` with the client's personal model's loss and accuracy added (its global ones if it has none)."""
    _load(model, global_params, fixed)
    if not local.adapt(model, state, client, data):
        return replace(score, personal_loss=score.loss, personal_accuracy=score.accuracy)
    own = _group_scores(model, [client], data)[0]
    return replace(score, personal_loss=own.loss, personal_accuracy=own.accuracy, personal=True)
