"""Every-client evaluation, server side: who is evaluated and when, the evaluation tasks, and the distribution.

FL papers report more than the global model's test accuracy: personalisation papers report each client's accuracy
with its own model, fairness papers the spread across clients (the worst 10 %, the variance). On an evaluation
round the server scores a set of clients on their local test splits (``client_test_fraction`` of each client's
data), through the executor, in parallel, and summarises the per-client values:

* ``evaluate_clients.who``: ``sampled`` (the round's clients, the default), ``all``, or ``cohort`` (a fixed set of
  ``size`` clients drawn once from the run seed); ``every``: every that many rounds (``null``: with ``eval_every``),
  and after the last round.
* metric names: ``eval_global/<stat>`` for the global model, ``eval_personal/<stat>`` for the clients' personal
  models when the algorithm has them (FedPer, FedRep, FedBN, Ditto); see :func:`summary`. ``eval/`` stays the
  global model on the centralized test set.
* per-client values: ``<run dir>/client_eval/round-<NNNN>.csv``, one row per client.
* token data (a language model's ``[N, T]`` labels; the scores are :class:`TokenScore`): each client's perplexity
  too, ``exp`` of its loss (the mean over its examples of each one's mean token loss), as ``.../perplexity_<stat>``
  and a ``perplexity`` column; ``.../perplexity`` is ``exp`` of the example-weighted loss.

Clients are grouped into tasks of about :data:`EXAMPLES_PER_TASK` test examples, in client-id order, from the
clients alone: scores are the same under every executor and worker count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import Any

import numpy as np

from fedsim.client.base import Client
from fedsim.core.progress import progress
from fedsim.core.seeding import cohort_rng
from fedsim.core.types import ClientScore, EvalTask

WHO = ("sampled", "all", "cohort")
EXAMPLES_PER_TASK = 2048  # test examples per evaluation task: large enough that a task's overhead is small
STATS = ("mean", "std", "p10", "p50", "p90", "worst10", "best10")


@dataclass(frozen=True)
class ClientEvaluation:
    """Which clients are scored on their local test splits (``who``, ``size``) and how often (``every``)."""

    who: str = "sampled"
    size: int | None = None
    every: int | None = None

    def __post_init__(self) -> None:
        for name in ("size", "every"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, Integral)):
                raise ValueError(f"evaluate_clients.{name} must be an integer >= 1 or null (got {value!r})")
        if self.who not in WHO:
            raise ValueError(f"evaluate_clients.who must be one of {', '.join(WHO)} (got {self.who!r})")
        if self.who == "cohort" and (self.size is None or self.size < 1):
            raise ValueError(
                f"evaluate_clients.size must be >= 1 with evaluate_clients=cohort (got {self.size}), e.g. "
                "evaluate_clients.size=100"
            )
        if self.who != "cohort" and self.size is not None:
            raise ValueError(f"evaluate_clients.size is only read with evaluate_clients=cohort (got who={self.who})")
        if self.every is not None and self.every < 1:
            raise ValueError(f"evaluate_clients.every must be >= 1 or null (got {self.every})")

    def check(self, num_clients: int) -> None:
        """Refuse a cohort larger than the federation, before any work."""
        if self.who == "cohort" and self.size is not None and self.size > num_clients:
            raise ValueError(f"evaluate_clients.size must be <= the {num_clients} clients (got {self.size})")

    def due(self, round_num: int, eval_every: int, num_rounds: int) -> bool:
        """Whether round ``round_num`` scores clients: every ``every`` rounds (else ``eval_every``), and the last."""
        return round_num % (self.every or eval_every) == 0 or round_num == num_rounds

    def clients(self, sampled: Sequence[int], num_clients: int, seed: int) -> list[int]:
        """The ids to score this round, sorted."""
        if self.who == "all":
            return list(range(num_clients))
        if self.who == "cohort":
            assert self.size is not None
            return sorted(int(c) for c in cohort_rng(seed).choice(num_clients, size=self.size, replace=False))
        return sorted(int(c) for c in sampled)


def eval_tasks(
    round_num: int,
    client_ids: Sequence[int],
    clients: Sequence[Client],
    state_of: Callable[[int], dict[str, Any]] | None = None,
) -> list[EvalTask]:
    """The clients that have test examples, in groups of about :data:`EXAMPLES_PER_TASK` examples (client-id
    order); ``state_of(client id)`` gives each one's state when the algorithm has personal models."""
    tasks: list[EvalTask] = []
    group: list[int] = []
    examples = 0
    with progress(f"grouping {len(client_ids):,} clients' test sets", len(client_ids), "client") as advance:
        for i, cid in enumerate(sorted(client_ids), start=1):
            if i % 4096 == 0:
                advance(4096)
            n = int(clients[cid].test_indices.size)
            if n == 0:
                continue
            group.append(cid)
            examples += n
            if examples >= EXAMPLES_PER_TASK:
                tasks.append(_task(round_num, group, state_of))
                group, examples = [], 0
        advance(len(client_ids) % 4096)
    if group:
        tasks.append(_task(round_num, group, state_of))
    return tasks


def _task(round_num: int, group: list[int], state_of: Callable[[int], dict[str, Any]] | None) -> EvalTask:
    states = tuple(state_of(cid) for cid in group) if state_of is not None else ()
    return EvalTask(client_ids=tuple(group), round_num=round_num, states=states)


@dataclass(frozen=True)
class TokenScore(ClientScore):
    """A :class:`~fedsim.core.types.ClientScore` on token data (a language model's ``[N, T]`` labels): the same
    fields, with ``loss`` a token loss, so that :func:`summary` and :func:`csv_text` add each client's perplexity,
    ``exp(loss)``."""


def summary(scores: Sequence[ClientScore], personal: bool) -> dict[str, float]:
    """The distribution over ``scores``: ``eval_global/accuracy`` and ``/loss`` (example-weighted means, as one
    pass over all the clients' test examples gives), then for each of accuracy and loss ``_mean`` (unweighted),
    ``_std`` (population), ``_p10``, ``_p50``, ``_p90`` (linear interpolation), ``_worst10`` and ``_best10`` (the
    mean of the worst and best ⌈10 %⌉ of clients: lowest accuracy, highest loss), and ``/clients``. With
    ``personal``, the same for the personal models as ``eval_personal/...``, plus ``eval_personal/personalised``
    (clients that have a personal model yet). On token data (:class:`TokenScore`), each family adds
    ``/perplexity`` (``exp`` of its ``/loss``) and the same statistics over the clients' perplexities (worst: the
    highest)."""
    if not scores:
        return {}
    weights = np.array([s.num_examples for s in scores], dtype=np.float64)
    tokens = all(isinstance(s, TokenScore) for s in scores)
    result = _family("eval_global", [s.accuracy for s in scores], [s.loss for s in scores], weights, tokens)
    if personal:
        result |= _family(
            "eval_personal", [s.personal_accuracy for s in scores], [s.personal_loss for s in scores], weights, tokens
        )
        result["eval_personal/personalised"] = float(sum(s.personal for s in scores))
    return result


def _family(
    prefix: str, accuracy: Sequence[Any], loss: Sequence[Any], weights: np.ndarray, tokens: bool = False
) -> dict[str, float]:
    result = {f"{prefix}/clients": float(len(weights))}
    for name, values, higher_is_better in (("accuracy", accuracy, True), ("loss", loss, False)):
        v = np.asarray(values, dtype=np.float64)
        result[f"{prefix}/{name}"] = float(np.sum(v * weights) / np.sum(weights))
        result |= {f"{prefix}/{name}_{stat}": value for stat, value in spread(v, higher_is_better).items()}
    if tokens:
        result[f"{prefix}/perplexity"] = math.exp(result[f"{prefix}/loss"])
        perplexities = np.exp(np.asarray(loss, dtype=np.float64))
        result |= {f"{prefix}/perplexity_{stat}": value for stat, value in spread(perplexities, False).items()}
    return result


def spread(values: np.ndarray, higher_is_better: bool) -> dict[str, float]:
    """Unweighted mean, std, p10/p50/p90, and the mean of the worst and best ⌈10 %⌉ of ``values``."""
    ordered = np.sort(values)
    k = max(1, math.ceil(0.1 * len(ordered)))
    low, high = float(np.mean(ordered[:k])), float(np.mean(ordered[-k:]))
    p10, p50, p90 = (float(x) for x in np.percentile(ordered, [10, 50, 90]))
    return {
        "mean": float(np.mean(ordered)),
        "std": float(np.std(ordered)),
        "p10": p10,
        "p50": p50,
        "p90": p90,
        "worst10": low if higher_is_better else high,
        "best10": high if higher_is_better else low,
    }


def csv_text(scores: Sequence[ClientScore], personal: bool) -> str:
    """The per-client file: a header, then one row per client in id order (floats in full precision); on token data
    (:class:`TokenScore`) a ``perplexity`` column (and ``personal_perplexity``) after the losses' own."""
    tokens = bool(scores) and all(isinstance(s, TokenScore) for s in scores)
    header = "client,num_examples,loss,accuracy" + (",perplexity" if tokens else "")
    if personal:
        header += ",personal_loss,personal_accuracy" + (",personal_perplexity" if tokens else "") + ",personalised"
    rows = [header]
    for s in sorted(scores, key=lambda s: s.client_id):
        row = f"{s.client_id},{s.num_examples},{s.loss!r},{s.accuracy!r}" + (f",{_exp(s.loss)!r}" if tokens else "")
        if personal:
            row += f",{s.personal_loss!r},{s.personal_accuracy!r}" + (f",{_exp(s.personal_loss)!r}" if tokens else "")
            row += f",{int(s.personal)}"
        rows.append(row)
    return "\n".join(rows) + "\n"


def _exp(loss: float | None) -> float:
    """A client's perplexity from its token loss (nan without one)."""
    return math.exp(loss) if loss is not None and math.isfinite(loss) else math.nan


def describe(metrics: dict[str, float]) -> str | None:
    """One line for the run log: the clients' accuracy distribution(s) of an evaluation round, or ``None``; on token
    data their perplexity's (p90 and the worst 10 %: the highest)."""
    if "eval_global/accuracy" not in metrics:
        return None
    tokens = "eval_global/perplexity" in metrics
    name, low = ("perplexity", "p90") if tokens else ("accuracy", "p10")
    parts = [f"{int(metrics['eval_global/clients'])} clients' {name}"]
    for prefix, label in (("eval_global", "global"), ("eval_personal", "personal")):
        if f"{prefix}/{name}" in metrics:
            parts.append(
                f"{label} {metrics[f'{prefix}/{name}']:.4f} ({low} {metrics[f'{prefix}/{name}_{low}']:.4f}, "
                f"worst 10% {metrics[f'{prefix}/{name}_worst10']:.4f}, std {metrics[f'{prefix}/{name}_std']:.4f})"
            )
    if "eval_personal/personalised" in metrics:
        parts.append(f"{int(metrics['eval_personal/personalised'])} with a personal model yet")
    return ", ".join(parts)
