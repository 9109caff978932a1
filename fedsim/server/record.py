"""What a round has produced so far: the :class:`RoundRecord` every stage reads and extends (the contract)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedsim.core.types import ClientUpdate, TaskResult
from fedsim.sim.clock import RoundSchedule


@dataclass
class RoundRecord:
    """One round as its stages build it up. Each field is written by the stage named below and read by the stages
    after it; a stage of your own may read any field that is set when it runs and change the ones marked
    *changeable* (tensors are never changed in place: assign a new one).

    Always set:

    * ``round_num``: the round (1-based; an asynchronous strategy's server step).
    * ``start_params``: the global weights the round started from (flat float32, never changed).
    * ``params``: the global weights: ``start_params`` until ``aggregate`` replaces them with the strategy's result;
      *changeable* after ``aggregate`` (a stage ``after aggregate`` that clips the aggregated update sets it).
    * ``start_s``: ``time.perf_counter()`` when the round started.
    * ``metrics``: the round's scalars so far, logged to ``metrics.jsonl`` and TensorBoard when the round ends. A
      stage's own metrics are what its ``run`` returns (logged as ``<stage name>/<key>``), not entries it writes here.

    Set by ``plan``: ``configs`` (each task's config by client id: who trains this round; *changeable* before
    ``dispatch``) and, on the simulated clock, ``schedule`` (who finishes, drops out or is cut by the deadline).

    Set by ``dispatch``: ``states`` (each task's client state as stored), ``received`` (the global weights as the
    clients received them, after the downlink codecs) and ``results`` (each task's result as the client would upload
    it, sorted by client id: a :class:`~fedsim.core.types.ClientUpdate`, or a
    :class:`~fedsim.core.types.ClientFailure`), and ``fit_s`` (seconds from the round's start to the last result).
    ``upload`` replaces ``results`` with what the server decodes (the uplink codecs).

    Set by ``receive``: ``succeeded`` (the successful updates), ``updates`` (those that passed the server's checks)
    and ``kept`` (those that reach aggregation; *changeable* until ``aggregate``: e.g. ``stragglers`` drops the
    stragglers' updates here). ``aggregate_input``: what the strategy aggregates instead of ``kept`` when a stage
    replaces the individual updates (central DP's one noisy mean update); ``None`` otherwise.

    Set by ``aggregate``: ``params`` (see above), ``from_strategy`` (the strategy's scalars, logged as
    ``strategy/...``) and ``client_values`` (its per-client values, added to the client rows).

    ``client_extras``: fields a stage adds to a client's row of ``metrics.jsonl`` (by client id), written before
    ``measure``, which builds ``rows`` (one per checked update) and ``evaluated_ids`` (whom federated evaluation scores
    this round). ``central_evaluated``: whether ``evaluate`` scored the global model on the test set this round.

    ``stop_reason``: a stage that sets it ends the run after this round, with a checkpoint and this reason in
    ``summary.json`` (central DP does when the next round would exceed its budget).

    An asynchronous server step (FedBuff) has no ``plan``, ``dispatch``, ``upload`` or ``receive``: its ``aggregate``
    sets ``results``, ``updates``, ``kept`` (= ``updates``) and ``consumed`` (each update with the weights its client
    started from)."""

    round_num: int
    start_params: torch.Tensor
    start_s: float
    params: torch.Tensor
    configs: dict[int, dict[str, Any]] = field(default_factory=dict)
    schedule: RoundSchedule | None = None
    states: dict[int, dict[str, Any]] = field(default_factory=dict)
    received: torch.Tensor | None = None
    results: Sequence[TaskResult] = field(default_factory=list)
    fit_s: float = 0.0
    succeeded: list[ClientUpdate] = field(default_factory=list)
    updates: list[ClientUpdate] = field(default_factory=list)
    kept: list[ClientUpdate] = field(default_factory=list)
    aggregate_input: list[ClientUpdate] | None = None
    from_strategy: dict[str, float] = field(default_factory=dict)
    client_values: dict[int, dict[str, Any]] | None = None
    consumed: list[tuple[ClientUpdate, torch.Tensor]] = field(default_factory=list)
    client_extras: dict[int, dict[str, Any]] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    evaluated_ids: list[int] = field(default_factory=list)
    central_evaluated: bool = False
    stop_reason: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def client_ids(self) -> list[int]:
        """The round's tasks' clients, sorted (after ``plan``)."""
        return sorted(self.configs)

    def add_to_rows(self, client_id: int, **fields: Any) -> None:
        """Add ``fields`` to ``client_id``'s row in ``metrics.jsonl`` (call before ``measure``)."""
        self.client_extras.setdefault(client_id, {}).update(fields)
