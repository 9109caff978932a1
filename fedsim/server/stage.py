"""A round is a list of stages: the contract of one (:class:`RoundStage`), where an added one goes (its position),
and how the stages' declarations are checked against each other before the first round.

The built-in stages of a synchronous round, in order (:data:`SYNC_STAGES`)::

    plan → dispatch → upload → receive → aggregate → commit → measure → evaluate

``plan`` samples the clients and builds their task configs; ``dispatch`` sends the global weights through the
downlink codecs and trains; ``upload`` decodes each update as the server receives it (the uplink codecs); ``receive``
applies the failure policy and the server's checks; ``aggregate`` calls the strategy; ``commit`` keeps the accepted
client states; ``measure`` builds the client rows and the training metrics; ``evaluate`` scores the global model.
An asynchronous server step (FedBuff) is ``aggregate → commit → measure → evaluate`` (:data:`ASYNC_STAGES`).

The optional capabilities are stages placed the same way a researcher's are: ``stragglers`` (after receive),
central DP's ``dp`` (before aggregate) and its Poisson ``plan`` (instead of plan), the clock's ``plan`` (instead of
plan) and ``clock`` (after measure), the attack's ``attack`` (after dispatch), ``attack_report`` (after measure) and
``backdoor`` (after evaluate), DP-SGD's ``local_dp`` (after measure).

**Declarations.** A stage says what it ``needs`` from the round and what it ``preserves`` for the stages after it,
in a small vocabulary: :data:`UPDATES` (each client's update, individually) and :data:`CLOCK` (simulated time). The
round starts with both (the clock only when there is one); a stage that does not preserve a fact takes it away from
every stage after it (central DP's noisy mean and secure aggregation leave only the aggregate). The ``aggregate``
stage needs what the strategy declares (:attr:`fedsim.strategy.Strategy.needs`). A stage that declares no needs is
taken to read the individual updates. :func:`check_declarations` refuses, in one line naming both stages, a stage
that needs what an earlier stage took away.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch

from fedsim.server.record import RoundRecord

UPDATES = "updates"  # each client's update reaches the stage individually (record.kept as the clients sent them)
CLOCK = "clock"  # the round runs on the simulated clock (record.schedule)
FACTS = {UPDATES: "the individual client updates", CLOCK: "the simulated clock"}
SYNC_STAGES = ("plan", "dispatch", "upload", "receive", "aggregate", "commit", "measure", "evaluate")
ASYNC_STAGES = ("aggregate", "commit", "measure", "evaluate")
# metric namespaces that belong to fedsim (docs/concepts.md): a stage of one's own may not take these names
RESERVED = frozenset(
    {"train", "eval", "eval_global", "eval_personal", "client", "clients", "time", "system", "comm", "dp", "attack"}
    | {"sim", "strategy", "fit", "participants", "round", "stage", "stages", "by_sim_time", "vs_kb_sent"}
)
NAME = re.compile(r"[a-z][a-z0-9_]*")
_POSITION = re.compile(r"\s*(before|after|instead of)\s+([a-z][a-z0-9_]*)\s*")


class Stateful(Protocol):
    """A part of the run with its own entry in the checkpoint (the clock, the exchange's byte ledger, a stage)."""

    def state_dict(self) -> dict[str, Any]:
        """The part's state after a round: tensors and plain values (checkpoints load with ``weights_only``)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`state_dict` returned."""
        ...


class RoundStage:
    """One step of a round. Subclass it and implement :meth:`run`; give a stage of your own a :attr:`name` and a
    :attr:`position` (class attributes, or set on the instance), then add it with ``Stages(extra=[...])`` or the
    ``round.extra`` config list (docs/writing-a-round-step.md).

    * :attr:`name`: lower case, unique in the round; its metrics are logged as ``<name>/<key>`` and its state is its
      checkpoint entry ``stage/<name>``.
    * :attr:`position`: ``"before X"``, ``"after X"`` or ``"instead of X"``, X the name of a stage of the round
      (:data:`SYNC_STAGES`, a capability's or an earlier added stage's). Several stages at one position run in the
      order they were added. A stage ``instead of X`` takes X's name too (its metrics are ``X/<key>``).
    * :attr:`needs` and :attr:`preserves`: what the stage reads of the round and what it leaves for the stages after
      it (:data:`FACTS`); ``needs = None`` (the default) is taken to read the individual updates, ``preserves =
      None`` (the default) leaves everything as it found it.
    * State: return a dict of tensors and plain values from :meth:`state_dict` and take it back in
      :meth:`load_state_dict`; it is saved with every checkpoint, so a resumed run continues it exactly. A stage
      that does not override :meth:`state_dict` keeps no state.
    """

    name: str = ""
    position: str = ""
    needs: frozenset[str] | None = None
    preserves: frozenset[str] | None = None
    label: str = ""  # how a refusal names the stage (default: its class)

    def run(self, record: RoundRecord) -> Mapping[str, float] | None:
        """Read and extend ``record``; return the stage's metrics for this round (``None``: none)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The stage's state after a round (tensors and plain values only)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def checkpoint_parts(self) -> dict[str, Stateful]:
        """The stateful parts the stage owns, by checkpoint entry: the stage itself as ``stage/<name>`` when it
        overrides :meth:`state_dict` (built-in stages name the parts they own: the clock, the byte ledger, ...)."""
        return {f"stage/{self.name}": self} if type(self).state_dict is not RoundStage.state_dict else {}


def stage_label(stage: RoundStage) -> str:
    """``'clip' (my_stages.ClipAggregate)``: how a refusal names a stage."""
    return f"'{stage.name}' ({stage.label or f'{type(stage).__module__}.{type(stage).__qualname__}'})"


def parse_position(stage: RoundStage) -> tuple[str, str]:
    """``(side, anchor)`` of the stage's position; refused in one line when it does not parse."""
    match = _POSITION.fullmatch(str(stage.position).lower())
    if match is None:
        raise ValueError(
            f"round: stage {stage_label(stage)} has position {stage.position!r}; say 'before X', 'after X' or "
            f"'instead of X', X one of the round's stages ({', '.join(SYNC_STAGES)}, ...)"
        )
    return match.group(1), match.group(2)


def place(base: Sequence[RoundStage], added: Sequence[RoundStage]) -> list[RoundStage]:
    """``base`` with each of ``added`` at its position, in order: stages ``after X`` follow those added after X
    before them, stages ``before X`` come just before X; ``instead of X`` takes X's place (and name as an anchor)."""
    slots: list[tuple[str, RoundStage]] = [(s.name, s) for s in base]
    after: dict[str, int] = {}
    replaced: set[str] = set()
    for stage in added:
        side, anchor = parse_position(stage)
        names = [name for name, _ in slots]
        if anchor not in names:
            raise ValueError(
                f"round: stage {stage_label(stage)} is placed {stage.position!r}, but this round has no stage "
                f"'{anchor}' (its stages: {', '.join(names)})"
            )
        i = names.index(anchor)
        if side == "instead of":
            if anchor in replaced:
                raise ValueError(
                    f"round: stage {stage_label(stage)} would replace '{anchor}', which "
                    f"{stage_label(slots[i][1])} replaces already; only one stage may take a stage's place"
                )
            object.__setattr__(stage, "name", anchor)  # it takes the place and the name (later positions use it)
            slots[i] = (anchor, stage)
            replaced.add(anchor)
        elif side == "before":
            slots.insert(i, (stage.name, stage))
        else:
            slots.insert(i + 1 + after.get(anchor, 0), (stage.name, stage))
            after[anchor] = after.get(anchor, 0) + 1
    return [stage for _, stage in slots]


def check_names(stages: Sequence[RoundStage], added: Sequence[RoundStage]) -> None:
    """Refuse, in one line, an added stage without a usable name, with a name of fedsim's metric namespaces, or
    with the name of another stage of the round."""
    taken = [s.name for s in stages if not any(s is a for a in added)]
    for stage in added:
        if str(stage.position).strip().lower().startswith("instead of"):
            continue  # it takes the name of the stage it replaces (place)
        if not isinstance(stage.name, str) or not NAME.fullmatch(stage.name):
            raise ValueError(
                f"round: stage {type(stage).__module__}.{type(stage).__qualname__} needs a name of lower-case letters, "
                f"digits and _ (got {stage.name!r}): its metrics are logged as <name>/..."
            )
        if stage.name in RESERVED or stage.name in taken:
            raise ValueError(
                f"round: stage {stage_label(stage)} may not be named {stage.name!r}: "
                f"{'a metric namespace of fedsim' if stage.name in RESERVED else 'another stage of the round has it'}"
                "; give it another name"
            )
        taken.append(stage.name)


def check_declarations(stages: Sequence[RoundStage], available: set[str]) -> None:
    """Walk the round in order: every stage must find what it needs among the facts the stages before it passed
    on (``available`` at the start). One line naming the stage, the fact and the stage that took it away."""
    have, taken_by = set(available), dict[str, RoundStage]()
    for stage in stages:
        needs = stage.needs if stage.needs is not None else frozenset({UPDATES})
        missing = sorted(needs - have)
        if missing:
            raise ValueError(_missing(stage, missing[0], taken_by.get(missing[0])))
        if stage.preserves is not None:
            for fact in have - stage.preserves:
                taken_by[fact] = stage
            have &= set(stage.preserves)


def _missing(stage: RoundStage, fact: str, taken_by: RoundStage | None) -> str:
    """The one line refusing ``stage``, which needs ``fact`` (taken away by ``taken_by``, or never there)."""
    if taken_by is not None:
        why = f"which stage {stage_label(taken_by)} before it does not pass on"
    else:
        why = (
            "which this run does not have" if fact in FACTS else f"which is not a fact of a round ({', '.join(FACTS)})"
        )
    undeclared = " (it declares no needs, so it is taken to read them)" if stage.needs is None else ""
    hint = "; if it reads only the aggregate, declare needs = frozenset()" if fact == UPDATES else ""
    if fact == UPDATES and stage.name == "aggregate":
        hint = (
            "; use a strategy of the mean update (fedavg, fedprox, fedavgm, fedadam, fedyogi, fedadagrad), "
            "or declare needs = frozenset() on yours if it aggregates their mean alone"
        )
    return (
        f"round: stage {stage_label(stage)} needs {FACTS.get(fact, repr(fact))}{undeclared}, {why}{hint} "
        "(docs/writing-a-round-step.md)"
    )


def stage_metrics(stage: RoundStage, values: Mapping[str, Any]) -> dict[str, float]:
    """``values`` (what a stage's ``run`` returned) as the round's metrics ``<name>/<key>``; a key that is not a name
    or a value that is not a real number is refused with one line naming the stage."""
    out = {}
    for key, value in values.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z0-9_.\-/]+", key):
            raise ValueError(
                f"round: stage {stage_label(stage)} returned a metric named {key!r}; use letters, digits, _.-/"
            )
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise TypeError(f"round: stage {stage_label(stage)} returned {key}={value!r}, not a real number")
        out[f"{stage.name}/{key}"] = float(value)
    return out


def run_stages(stages: Sequence[RoundStage], record: RoundRecord) -> RoundRecord:
    """Run ``stages`` in order on ``record``, adding each one's returned metrics to ``record.metrics``."""
    for stage in stages:
        returned = stage.run(record)
        if returned:
            record.metrics.update(stage_metrics(stage, returned))
    return record
