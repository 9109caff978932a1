"""What the :class:`~fedsim.server.Server` does once: check its settings, build the round-0 model and the update
pipeline, and restore the parts of a resumed run."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fedsim.client.federation import representatives
from fedsim.client.state import ClientStateStore, restore_states, source_store
from fedsim.core.checkpoint import CheckpointError, drop_checkpoints_after, list_checkpoints, load_checkpoint
from fedsim.core.seeding import init_seed
from fedsim.server.resume_check import record_changes
from fedsim.server.stragglers import Stragglers

if TYPE_CHECKING:
    from fedsim.attacks.base import Attack
    from fedsim.attacks.stage import AttackStage
    from fedsim.client.base import Client
    from fedsim.comm.pipeline import Compression
    from fedsim.data.tensor_data import TensorData
    from fedsim.observe.run_logger import RunLogger
    from fedsim.privacy.local import LocalLedger
    from fedsim.server.early_stop import EarlyStop
    from fedsim.server.exchange import Exchange
    from fedsim.server.parts import Stateful

log = logging.getLogger("fedsim")


def check_settings(
    num_rounds: int, eval_every: int, clients_per_round: int, num_clients: int, stragglers: Stragglers
) -> None:
    """Refuse impossible round settings with one line; warn about stragglers that cannot straggle."""
    if num_rounds < 1 or eval_every < 1:
        raise ValueError(f"num_rounds and eval_every must be >= 1 (got {num_rounds}, {eval_every})")
    if not 1 <= clients_per_round <= num_clients:
        raise ValueError(f"clients_per_round must be between 1 and the {num_clients} clients (got {clients_per_round})")
    if stragglers.fraction > 0 and stragglers.epochs < 2:
        log.warning(
            "stragglers.fraction=%s has no effect: with %d local epoch(s) there is nothing to cut",
            stragglers.fraction,
            stragglers.epochs,
        )


def initial_model(model_factory: Callable[[], nn.Module], seed: int) -> nn.Module:
    """The round-0 global model, from the run seed only (the caller's global RNG is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(init_seed(seed))
        return model_factory()


def check_model_fits_data(model: nn.Module, data: TensorData) -> None:
    """Refuse, in one line and before any training, a model whose output does not have one score per class of the
    data (its labels would be out of range in every client's loss); with token labels ``[N, T]``, one per class at
    each of the ``T`` positions. One forward pass of two rows, in evaluation
    mode and without gradients; the model's mode is restored."""
    if len(data) == 0:
        return
    largest = int(data.y.max())
    if largest >= data.num_classes:
        raise ValueError(
            f"data: a training label is {largest} but the data declares {data.num_classes} classes; "
            "set the dataset's num_classes to at least the largest label + 1"
        )
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(data.x[:2])
    except (RuntimeError, ValueError, IndexError, TypeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"model: {type(model).__name__} cannot take the data's examples of shape {tuple(data.x.shape[1:])} "
            f"({data.x.dtype}): {first}; pick a model made for this data (docs/datasets.md lists them)"
        ) from None
    finally:
        model.train(was_training)
    if data.y.ndim == 2:  # token labels: a score per class at every position
        if out.shape[1:] != (data.y.shape[1], data.num_classes):
            raise ValueError(
                f"model: {type(model).__name__} outputs {tuple(out.shape[1:])} scores per example but the data has "
                f"{data.y.shape[1]} positions of {data.num_classes} tokens; set the model's vocabulary to the data's"
            )
        return
    if out.ndim != 2 or out.shape[1] != data.num_classes:
        raise ValueError(
            f"model: {type(model).__name__} outputs {tuple(out.shape[1:])} scores per example but the data has "
            f"{data.num_classes} classes; build the model with num_classes={data.num_classes} (fedsim passes the "
            "data's num_classes to a `_partial_: true` model option)"
        )


@dataclass
class Pipeline:
    """The server's update pipeline: what crosses the wire (``comm``), DP-SGD clients' privacy ledger (``local_dp``,
    None without them), the attack (``attack``, None without one), and the training data and clients the run uses
    (a data attack's poisoned copies replace the malicious clients' own)."""

    comm: Exchange
    local_dp: LocalLedger | None
    attack: AttackStage | None
    train_data: TensorData
    clients: Sequence[Client]


def build_pipeline(
    compression: Compression | None,
    attack: Attack | None,
    *,
    params: torch.Tensor,
    model: nn.Module,
    seed: int,
    clients: Sequence[Client],
    train_data: TensorData,
    test_data: TensorData | None,
    run_dir: Path | None,
) -> Pipeline:
    """The :class:`Pipeline` of a run whose round-0 weights are ``params``. Refuses, in one line, what the
    asynchronous loop cannot run with."""
    from fedsim.attacks.stage import attack_stage
    from fedsim.comm.pipeline import Compression
    from fedsim.privacy.local import local_ledger
    from fedsim.server.exchange import Exchange

    comm = Exchange(compression or Compression(), params.numel(), seed)
    local_dp = local_ledger(representatives(clients), model)  # one client per class of a Population
    stage = attack_stage(attack, len(clients), seed, run_dir)
    if stage is not None:
        train_data, clients = stage.poison_data(train_data, test_data, clients)
    return Pipeline(comm, local_dp, stage, train_data, clients)


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
    DP-SGD's ledger (empty)."""
    for key, part in parts.items():
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
