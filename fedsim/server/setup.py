"""What the :class:`~fedsim.server.Server` does once: check its settings, build the round-0 model, the update
pipeline and the run's parts."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedsim.client.base import Client
from fedsim.client.federation import representatives, train_sizes
from fedsim.client.local_training import LocalTraining, overrides_on_batch
from fedsim.client.state import ClientStateStore
from fedsim.core.params import ParamLayout
from fedsim.core.progress import progress
from fedsim.core.seeding import init_seed
from fedsim.executor.base import Executor
from fedsim.observe.run_logger import RunLogger
from fedsim.privacy.rounds import PrivateRounds, private_rounds
from fedsim.server.buffered import BufferedLoop, event_loop
from fedsim.server.central_eval import DeviceEvaluator, eval_device
from fedsim.server.parts import RoundParts
from fedsim.server.settings import Evaluation, Federation, Schedule, Stages
from fedsim.server.stragglers import Stragglers
from fedsim.sim.rounds import check_sampling
from fedsim.strategy.base import Strategy
from fedsim.strategy.context import RunContext
from fedsim.strategy.root_data import root_trainer

if TYPE_CHECKING:
    from fedsim.attacks.base import Attack
    from fedsim.attacks.stage import AttackStage
    from fedsim.comm.pipeline import Compression
    from fedsim.data.tensor_data import TensorData
    from fedsim.privacy.local import LocalLedger
    from fedsim.server.exchange import Exchange

log = logging.getLogger("fedsim")


def check_settings(
    num_rounds: int,
    eval_every: int,
    clients_per_round: int,
    num_clients: int,
    stragglers: Stragglers,
    local_steps: int | None = None,
) -> None:
    """Refuse impossible round settings with one line; warn about stragglers that cannot straggle (``local_steps``:
    the clients' K, whose steps a straggler cuts instead of epochs)."""
    if num_rounds < 1 or eval_every < 1:
        raise ValueError(f"num_rounds and eval_every must be >= 1 (got {num_rounds}, {eval_every})")
    if not 1 <= clients_per_round <= num_clients:
        raise ValueError(f"clients_per_round must be between 1 and the {num_clients} clients (got {clients_per_round})")
    unit, full = ("local epoch(s)", stragglers.epochs) if local_steps is None else ("local step(s)", local_steps)
    if stragglers.fraction > 0 and full < 2:
        log.warning(
            "stragglers.fraction=%s has no effect: with %d %s there is nothing to cut", stragglers.fraction, full, unit
        )


def check_local_training(local: LocalTraining | None, model: nn.Module, clients: Sequence[Client]) -> None:
    """Refuse in one line, before any work, what the strategy's client half cannot train: the model it objects to
    (:meth:`~fedsim.client.local_training.LocalTraining.check`, e.g. MOON's representation), or clients whose own epoch
    loop (DP-SGD's) would skip its per-batch hook."""
    if local is None:
        return
    local.check(model)
    if not overrides_on_batch(local):
        return
    for client in representatives(clients):
        if isinstance(client, Client) and type(client)._run_epoch is not Client._run_epoch:
            raise ValueError(
                f"strategy: {type(local).__name__} steps on every batch (on_batch) but {type(client).__name__} has its "
                "own epoch loop that would skip it: use client=sgd or client=adam"
            )


def clients_local_steps(clients: Sequence[Client]) -> int | None:
    """The K of clients that train ``local_steps`` (the first client class that sets them), else ``None``."""
    steps = (getattr(c, "local_steps", None) for c in representatives(clients))
    return next((int(k) for k in steps if k is not None), None)


def check_run(
    federation: Federation, strategy: Strategy, schedule: Schedule, evaluation: Evaluation, stages: Stages, seed: int
) -> tuple[Stragglers, BufferedLoop | None, PrivateRounds | None]:
    """Every setting checked, before any work, with one line naming it; returns the run's stragglers, the event loop
    of an asynchronous strategy (FedBuff; else ``None``) and central DP's rounds (``None`` without DP)."""
    num_clients, clock = len(federation.clients), stages.clock
    stragglers, steps = stages.stragglers or Stragglers(), clients_local_steps(federation.clients)
    check_settings(schedule.num_rounds, evaluation.every, schedule.clients_per_round, num_clients, stragglers, steps)
    evaluation.clients.check(num_clients)
    strategy.check(schedule.clients_per_round)
    if clock is not None:
        if steps is not None:
            raise ValueError(
                f"clock: the simulated clock times and cuts whole local epochs, so it cannot run clients with "
                f"client.local_steps={steps} yet; set client.local_steps=null (and client.epochs) or clock=none"
            )
        clock.check(num_clients)
        check_sampling(clock, strategy)
    loop = event_loop(clock, strategy, num_clients, seed)
    privacy = private_rounds(stages.privacy, strategy, clock, num_clients, schedule.clients_per_round, seed)
    return stragglers, loop, privacy


def build_parts(
    model: nn.Module,
    params: torch.Tensor,
    federation: Federation,
    strategy: Strategy,
    executor: Executor,
    groups: tuple[Schedule, Evaluation, Stages],
    *,
    logger: RunLogger,
    checkpoint_dir: Path | None,
    seed: int,
    checked: tuple[Stragglers, BufferedLoop | None, PrivateRounds | None],
) -> RoundParts:
    """The run's :class:`~fedsim.server.parts.RoundParts`, from the round-0 ``model`` and its ``params``, the setting
    ``groups`` and what :func:`check_run` made of them (``checked``)."""
    (schedule, evaluation, stages), (stragglers, _, privacy) = groups, checked
    pipeline = build_pipeline(
        stages.compression,
        stages.attack,
        params=params,
        model=model,
        seed=seed,
        clients=federation.clients,
        train_data=federation.train_data,
        test_data=federation.test_data,
        run_dir=logger.run_dir,
    )
    state_dir = checkpoint_dir / "client_state" if checkpoint_dir is not None else None
    return RoundParts(
        clients=pipeline.clients,  # a data attack's poisoned copies
        clean_clients=federation.clients,
        train_data=pipeline.train_data,
        test_data=federation.test_data,
        executor=executor,
        strategy=strategy,
        comm=pipeline.comm,
        client_states=ClientStateStore(federation.state_store, state_dir),
        logger=logger,
        evaluator=DeviceEvaluator(model, eval_device(evaluation.device)),
        schedule=schedule,
        evaluation=evaluation,
        stragglers=stragglers,
        seed=seed,
        clock=stages.clock,
        privacy=privacy,
        attack=pipeline.attack,
        local_dp=pipeline.local_dp,
        checkpoint_dir=checkpoint_dir,
    )


def run_context(parts: RoundParts, model: nn.Module, start_round: int) -> RunContext:
    """What the strategy is told about the run (:meth:`~fedsim.strategy.Strategy.setup`), continuing at
    ``start_round``."""
    return RunContext(
        layout=ParamLayout.of(model),
        num_clients=len(parts.clients),
        num_examples=tuple(train_sizes(parts.clients).tolist()),  # a Population's sizes without its clients
        clients_per_round=parts.schedule.clients_per_round,
        num_rounds=parts.schedule.num_rounds,
        seed=parts.seed,
        run_dir=parts.logger.run_dir,
        start_round=start_round,
        root_trainer=functools.partial(
            root_trainer, model=model, clients=parts.clean_clients, data=parts.train_data, seed=parts.seed
        ),
    )


def initial_model(model_factory: Callable[[], nn.Module], seed: int) -> nn.Module:
    """The round-0 global model, from the run seed only (the caller's global RNG is left as it was)."""
    with torch.random.fork_rng(devices=[]), progress("building the model", None, "step"):
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
