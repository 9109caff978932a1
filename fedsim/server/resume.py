"""Resuming a run from a checkpoint: the stateful parts put back by entry, the client states checked and brought
back, the metrics history and early stopping continued (:class:`fedsim.server.checkpointing.RunCheckpoints` calls
these)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedsim.client.state import ClientStateStore, restore_states, source_store
from fedsim.core.checkpoint import CheckpointError, drop_checkpoints_after, list_checkpoints, load_checkpoint
from fedsim.observe.run_logger import RunLogger
from fedsim.server.early_stop import EarlyStop
from fedsim.server.resume_check import record_changes
from fedsim.server.stage import Stateful

log = logging.getLogger("fedsim")

# what a checkpoint written without a part's entry means for a resume that has the part
_MISSING = {
    "clock": "was written without a simulated clock; resume it without one (clock=none)",
    "privacy": "was written without differential privacy; resume it with dp=none",
    "async": "was written by a synchronous run; resume it with the strategy it was started with",
}
_DEFAULT: dict[str, Callable[[], dict[str, Any]]] = {"local_dp": lambda: {"steps": {}}}  # DP-SGD's ledger: none spent


def restore_parts(path: Path, state: dict[str, Any], parts: dict[str, Stateful]) -> None:
    """Put the run's stateful ``parts`` (by checkpoint entry, as the round's stages own them) back as the checkpoint
    at ``path`` (read as ``state``) recorded them. A part the checkpoint was written without is refused in one line
    saying how to resume, except the byte ledger (``comm``, counted from 0 for checkpoints older than it) and
    DP-SGD's ledger (empty); so is a stage's state (``stage/<name>``) that is missing, or that belongs to no stage
    of this run."""
    unknown = sorted(k for k in state if k.startswith("stage/") and k not in parts)
    if unknown:
        raise CheckpointError(
            f"{path} holds the state of round stage(s) this run does not have ({', '.join(k[6:] for k in unknown)}); "
            "resume with the stages the run was started with (round.extra)"
        )
    for key, part in parts.items():
        if key not in state and key.startswith("stage/"):
            raise CheckpointError(
                f"{path} was written without the state of round stage '{key[6:]}'; resume with the stages the run "
                "was started with (round.extra)"
            )
        if key not in state and key in _MISSING:
            raise CheckpointError(f"{path} {_MISSING[key]}")
        if key not in state and key not in _DEFAULT:
            continue  # checkpoints written before fedsim counted bytes start the totals at 0
        try:
            part.load_state_dict(state[key] if key in state else _DEFAULT[key]())
        except ValueError as error:
            if key != "privacy":
                raise
            raise CheckpointError(f"{path}: {error}; resume with the run's dp settings") from None


def _states_problem(path: Path, state: dict[str, Any], store: ClientStateStore) -> str | None:
    """Why the client states the checkpoint ``state`` (read from ``path``) recorded cannot all be read back; None when
    they can, or when the checkpoint was written before checkpoints listed them."""
    manifest = state.get("client_state_manifest")
    if manifest is None:
        return None
    source = source_store(store, path)
    if source is None:
        return f"its client states ({path.parent / 'client_state'}) are missing" if len(manifest) else None
    return source.problem(manifest, int(state.get("client_state_round", state["round"])))


def check_client_states(path: Path, state: dict[str, Any], store: ClientStateStore) -> None:
    """Refuse, in one line, a resume from ``path`` whose client states are not all there and intact (the resumed run
    would otherwise train some clients from an older state, or none, and silently differ), naming the first bad
    entry and the newest earlier checkpoint whose states are intact."""
    problem = _states_problem(path, state, store)
    if problem is None:
        return
    this_round = int(state["round"])
    for earlier in reversed(list_checkpoints(path.parent)):
        if int(earlier.stem.split("-")[1]) >= this_round:
            continue
        try:
            earlier_state = load_checkpoint(earlier)
        except CheckpointError:
            continue
        if "client_state_manifest" in earlier_state and _states_problem(earlier, earlier_state, store) is None:
            raise CheckpointError(f"{path}: {problem}; resume from {earlier} instead (resume={earlier})")
    raise CheckpointError(f"{path}: {problem}; no earlier checkpoint has its client states intact: start afresh")


def continue_records(
    path: Path,
    state: dict[str, Any],
    changes: dict[str, list[Any]],
    *,
    start_round: int,
    client_states: ClientStateStore,
    logger: RunLogger,
    early_stop: EarlyStop,
) -> None:
    """After a resume from ``path`` of a run that has rounds left: check that every client state the checkpoint
    needs is there and intact, record the allowed setting ``changes``, bring back the clients' states of the
    checkpoint's round (removing checkpoints of the abandoned later rounds), and the metrics history and early
    stopping up to it."""
    check_client_states(path, state, client_states)
    record_changes(logger.run_dir, path, int(state["round"]), changes)
    if restore_states(client_states, path, int(state.get("client_state_round", state["round"]))):
        for later in drop_checkpoints_after(path.parent, int(state["round"])):  # rounds the resume abandons
            log.warning(
                "resume from round %d: removed %s, a checkpoint of the abandoned later rounds", state["round"], later
            )
    logger.restore(state["history"], start_round, earlier=path.parent.parent / "metrics.jsonl")
    early_stop.replay(state["history"])
