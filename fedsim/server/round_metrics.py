"""What one round reports about its clients: a row per client update and the round's training scalars.

Metric names are namespaced so a user's never collide with fedsim's (``train/``, ``eval/``, ``client/``,
``time/``, ``system/``): keys a client adds to :attr:`ClientUpdate.metrics` beyond fedsim's own
(:data:`FEDSIM_CLIENT_KEYS`) appear in its row under ``"metrics"`` and, as the example-weighted mean over the
clients that reported them, as ``fit/<name>``; a strategy's :meth:`~Strategy.round_metrics` become
``strategy/<name>``.
"""

from __future__ import annotations

import logging
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import Strategy

log = logging.getLogger("fedsim")

FEDSIM_CLIENT_KEYS = frozenset({"train_loss", "local_steps", "lr"})  # set by Client.fit, not user metrics
NAME = re.compile(r"[A-Za-z0-9_.\-/]+")  # allowed user metric and strategy scalar names
_warned: set[str] = set()  # client metric keys already warned about (once per key and process)


def is_number(value: Any) -> bool:
    """A real number (int, float, numpy scalar), not a bool; NaN and inf count."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def user_metrics(update: ClientUpdate) -> dict[str, float]:
    """The client's own numeric metrics: its keys beyond fedsim's, with a valid name and a number for value.
    Any other extra key is left out, with one warning per key."""
    extras: dict[str, float] = {}
    for name, value in update.metrics.items():
        if name in FEDSIM_CLIENT_KEYS:
            continue
        if isinstance(name, str) and NAME.fullmatch(name) and is_number(value):
            extras[name] = float(value)
        elif repr(name) not in _warned:
            _warned.add(repr(name))
            log.warning(
                "client metric %r = %r ignored (client %d): names must match %s and values be numbers",
                name,
                value,
                update.client_id,
                NAME.pattern,
            )
    return extras


def client_row(update: ClientUpdate, global_params: torch.Tensor) -> dict[str, Any]:
    """One client's line of the round's ``clients`` record (``metrics.jsonl``); ``update_norm`` is the L2
    distance of its weights from the global weights it started from; ``metrics`` holds the client's own
    metrics (see :func:`user_metrics`; NaN/inf as ``None``), present only when it reported some."""
    row = {
        "client_id": update.client_id,
        "num_examples": update.num_examples,
        "train_loss": _finite_or_none(update.metrics.get("train_loss")),
        "update_norm": _finite_or_none(float(torch.linalg.vector_norm(update.params - global_params))),
        "epoch_losses": [_finite_or_none(loss) for loss in update.epoch_losses],
        "worker": update.worker,
        "device": update.device,
    }
    extras = user_metrics(update)
    if extras:
        row["metrics"] = {name: value if math.isfinite(value) else None for name, value in extras.items()}
    return row


def weighted_means(updates: list[ClientUpdate]) -> dict[str, float]:
    """``fit/<name>``: each client metric's mean weighted by example counts, over the clients that reported
    it (NaN when those hold no examples, or one reported NaN)."""
    sums: dict[str, float] = {}
    weights: dict[str, int] = {}
    for update in updates:
        for name, value in user_metrics(update).items():
            sums[name] = sums.get(name, 0.0) + value * update.num_examples
            weights[name] = weights.get(name, 0) + update.num_examples
    return {f"fit/{name}": sums[name] / weights[name] if weights[name] else math.nan for name in sums}


def train_metrics(updates: list[ClientUpdate], num_sampled: int) -> dict[str, float]:
    """Example-weighted mean training loss and client counts of one round, and the clients' own metrics
    as ``fit/<name>`` (see :func:`weighted_means`)."""
    examples = sum(u.num_examples for u in updates)
    loss = sum(u.metrics.get("train_loss", 0.0) * u.num_examples for u in updates) / examples if examples else math.nan
    return {
        "train/loss": loss,
        "client/num_sampled": float(num_sampled),
        "client/num_failed": float(num_sampled - len(updates)),  # raised, died, timed out or rejected
        "client/num_examples": float(examples),
        **weighted_means(updates),
    }


def strategy_scalars(strategy: Strategy, round_num: int) -> dict[str, float]:
    """The strategy's own scalars for the round (:meth:`Strategy.round_metrics`), named ``strategy/<name>``.

    Raises ``ValueError`` naming the strategy and the key for a name that does not match :data:`NAME` or a
    value that is not a number (bools included); NaN and inf are allowed."""
    owner = f"{type(strategy).__name__}.round_metrics()"
    scalars = strategy.round_metrics(round_num)
    if not isinstance(scalars, Mapping):
        raise ValueError(f"{owner} must return a dict of name -> number, got {type(scalars).__name__}")
    for name, value in scalars.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ValueError(f"{owner} returned the name {name!r}: names must match {NAME.pattern}")
        if not is_number(value):
            raise ValueError(f"{owner} returned {name!r} = {value!r}: values must be numbers (int or float)")
    return {f"strategy/{name}": float(value) for name, value in scalars.items()}


def strategy_client_values(strategy: Strategy, round_num: int, client_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """The strategy's per-client values for the round (:meth:`Strategy.client_metrics`) of the clients in
    ``client_ids`` (those whose updates it aggregated), NaN and inf as ``None``.

    Raises ``ValueError`` naming the strategy for a client it did not aggregate, a bad name or a value that is not a
    number."""
    owner = f"{type(strategy).__name__}.client_metrics()"
    values = strategy.client_metrics(round_num)
    if not isinstance(values, Mapping):
        raise ValueError(f"{owner} must return a dict of client id -> {{name: number}}, got {type(values).__name__}")
    allowed = set(client_ids)
    out: dict[int, dict[str, Any]] = {}
    for client_id, named in values.items():
        if isinstance(client_id, bool) or not isinstance(client_id, int) or client_id not in allowed:
            raise ValueError(
                f"{owner} returned values for client {client_id!r}, whose update it did not aggregate this round"
            )
        if not isinstance(named, Mapping):
            raise ValueError(
                f"{owner} returned {type(named).__name__} for client {client_id}: must be a dict of name -> number"
            )
        for name, value in named.items():
            if not isinstance(name, str) or not NAME.fullmatch(name):
                raise ValueError(f"{owner} returned the name {name!r}: names must match {NAME.pattern}")
            if not is_number(value):
                raise ValueError(
                    f"{owner} returned {name!r} = {value!r} for client {client_id}: "
                    "values must be numbers (int or float)"
                )
        out[client_id] = {name: _finite_or_none(float(value)) for name, value in named.items()}
    return out


def with_strategy_values(rows: list[dict[str, Any]], per_client: Mapping[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """The client rows, each with its client's values from :func:`strategy_client_values` under ``"strategy"`` (a
    client with two rows in one asynchronous step gets them on both)."""
    return [row | {"strategy": per_client[row["client_id"]]} if row["client_id"] in per_client else row for row in rows]


def _finite_or_none(value: Any) -> Any:
    """A float as itself, NaN or inf as ``None`` (``json.dumps`` would write a bare ``NaN``, not JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
