"""What the :class:`~fedsim.server.server.Server` does once: check its settings, build the round-0 model, resume a run."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fedsim.client.state import restore_states
from fedsim.core.checkpoint import CheckpointError, drop_checkpoints_after
from fedsim.core.checkpoint import resolve as resolve_checkpoint
from fedsim.core.seeding import init_seed
from fedsim.observe.metrics_records import without_client_rows
from fedsim.server.resume_check import check_changes, record_changes
from fedsim.server.stragglers import Stragglers

if TYPE_CHECKING:
    from fedsim.attacks.base import Attack
    from fedsim.comm.pipeline import Compression
    from fedsim.data.tensor_data import TensorData
    from fedsim.server.server import Server

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
    data (its labels would be out of range in every client's loss). One forward pass of two rows, in evaluation
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
    if out.ndim != 2 or out.shape[1] != data.num_classes:
        raise ValueError(
            f"model: {type(model).__name__} outputs {tuple(out.shape[1:])} scores per example but the data has "
            f"{data.num_classes} classes; build the model with num_classes={data.num_classes} (fedsim passes the "
            "data's num_classes to a `_partial_: true` model option)"
        )


def setup_pipeline(server: Server, compression: Compression | None, attack: Attack | None) -> None:
    """The server's update pipeline: what crosses the wire (``server.comm``), DP-SGD clients' ledger
    (``server.local_dp``) and the attack (``server.attack``; a data attack also replaces ``server.train_data`` and
    the malicious ``server.clients`` with poisoned copies). Refuses, in one line, what the asynchronous loop cannot
    run with."""
    from fedsim.attacks.stage import attack_stage
    from fedsim.comm.pipeline import Compression
    from fedsim.privacy.local import local_ledger
    from fedsim.server.exchange import Exchange

    server.comm = Exchange(compression or Compression(), server.params.numel(), server.seed)
    server.local_dp = local_ledger(server.clients, server.model)
    server.attack = attack_stage(attack, len(server.clients), server.seed, server.logger.run_dir)
    if server.attack is not None:
        server.train_data, server.clients = server.attack.poison_data(
            server.train_data, server.test_data, server.clients
        )


def checkpoint_state(server: Server, round_num: int) -> dict[str, Any]:
    """:meth:`fedsim.server.server.Server.state_dict`: everything a resumed run needs after ``round_num``. Sampling, task
    seeds and stragglers are pure functions of (seed, round), so the round number stands for every random state."""
    optional = {"clock": server.clock, "async": server.loop, "privacy": server.privacy, "local_dp": server.local_dp}
    return {
        "round": round_num,
        "params": server.params.clone(),
        "strategy": server.strategy.state_dict(),
        "history": without_client_rows(server.logger.history),  # the rows live in metrics.jsonl
        "client_state_round": server.client_states.round,  # its entries live in client_state/, versioned
        "fingerprint": server._fingerprint(),
        "settings": server.settings,  # what a resume may not change silently (fedsim.server.resume_check)
        "comm": server.comm.state_dict(),
        **{key: part.state_dict() for key, part in optional.items() if part is not None},
    }


def resume_from(server: Server, target: str | Path, allow_changes: Sequence[str] = ()) -> Path:
    """:meth:`fedsim.server.server.Server.resume`: put ``server`` in the state the checkpoint at ``target`` recorded."""
    path, state = resolve_checkpoint(target)
    if state.get("fingerprint") != server._fingerprint():
        raise CheckpointError(
            f"{path} belongs to another run setup: {state.get('fingerprint')} != {server._fingerprint()}"
        )
    changes = check_changes(state.get("settings", {}), server.settings, allow_changes, path)
    server.params = state["params"].to(server.params.dtype)
    server.start_round = int(state["round"]) + 1
    server.strategy.setup(server.run_context())  # told again, before its state comes back
    try:
        server.strategy.load_state_dict(state["strategy"])
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CheckpointError(
            f"{path}: its strategy state does not fit {type(server.strategy).__name__} ({type(error).__name__}: "
            f"{error}); resume with the strategy the run was started with"
        ) from None
    if server.clock is not None:
        if "clock" not in state:
            raise CheckpointError(f"{path} was written without a simulated clock; resume it without one (clock=none)")
        server.clock.load_state_dict(state["clock"])
    if server.loop is not None:
        server.loop.load_state_dict(state["async"])
    if "comm" in state:  # checkpoints written before fedsim counted bytes start the totals at 0
        server.comm.load_state_dict(state["comm"])
    if server.local_dp is not None:
        server.local_dp.load_state_dict(state.get("local_dp", {"steps": {}}))
    if server.privacy is not None:
        if "privacy" not in state:
            raise CheckpointError(f"{path} was written without differential privacy; resume it with dp=none")
        try:
            server.privacy.load_state_dict(state["privacy"])
        except ValueError as error:
            raise CheckpointError(f"{path}: {error}; resume with the run's dp settings") from None
    if server.finished:
        log.info("%s is of round %d: the run is finished, nothing to do", path, server.start_round - 1)
        return path  # nothing else is touched
    record_changes(server.logger.run_dir, path, int(state["round"]), changes)
    if restore_states(server.client_states, path, int(state.get("client_state_round", state["round"]))):
        for later in drop_checkpoints_after(path.parent, int(state["round"])):  # rounds the resume abandons
            log.warning(
                "resume from round %d: removed %s, a checkpoint of the abandoned later rounds", state["round"], later
            )
    server.logger.restore(state["history"], server.start_round, earlier=path.parent.parent / "metrics.jsonl")
    server.early_stop.replay(state["history"])
    log.info("resumed from %s: continuing at round %d", path, server.start_round)
    return path
