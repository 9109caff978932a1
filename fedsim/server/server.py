"""Server: the round loop. Sample → per-client config → local training → aggregate → evaluate → log."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedsim.client.federation import train_sizes
from fedsim.client.local_training import LocalTraining
from fedsim.client.scoring import evaluate_indices
from fedsim.client.state import ClientStateStore
from fedsim.core.checkpoint import CheckpointError, save_checkpoint, save_if_missing
from fedsim.core.checkpoint import resolve as resolve_checkpoint
from fedsim.core.errors import ClientMisuseError, RoundFailedError, StrategyError  # noqa: F401 (re-exported)
from fedsim.core.params import ParamLayout, flatten, load_flat
from fedsim.core.threads import torch_threads
from fedsim.executor.base import Executor, Workload
from fedsim.observe.metrics_records import without_client_rows
from fedsim.observe.run_logger import RunLogger
from fedsim.privacy.rounds import private_rounds
from fedsim.server.buffered import event_loop
from fedsim.server.central_eval import DeviceEvaluator
from fedsim.server.central_eval import eval_device as eval_device_named
from fedsim.server.early_stop import EarlyStop
from fedsim.server.federated_eval import evaluate_clients
from fedsim.server.parts import RoundParts, Stateful
from fedsim.server.resume_check import check_changes, check_fingerprint
from fedsim.server.round import (
    AdvanceClock,
    Aggregate,
    BufferedStep,
    CommitStates,
    Dispatch,
    Evaluate,
    Measure,
    MeasureStep,
    Plan,
    Receive,
    RoundRecord,
    RoundStage,
    checkpoint_parts,
    run_stages,
)
from fedsim.server.settings import MOVED, Checkpoints, Evaluation, Federation, Schedule, Stages
from fedsim.server.setup import build_pipeline, check_model_fits_data, continue_records, restore_parts
from fedsim.server.setup import check_settings as _check_settings
from fedsim.server.setup import initial_model as _initial_model
from fedsim.server.stragglers import Stragglers
from fedsim.sim.rounds import check_sampling
from fedsim.strategy.base import Strategy
from fedsim.strategy.context import RunContext
from fedsim.strategy.root_data import root_trainer

log = logging.getLogger("fedsim")
__all__ = ["ClientMisuseError", "RoundFailedError", "RunResult", "Server", "StrategyError"]


@dataclass
class RunResult:
    """The final global weights (flat), the model holding them and one metrics record per round."""

    params: torch.Tensor
    model: nn.Module
    history: list[dict[str, Any]] = field(default_factory=list)
    stopped_early: bool = False
    stop_reason: str = "completed"


class Server:
    """Runs ``schedule.num_rounds`` rounds of federated training (:mod:`fedsim.server.round`).

    ``model_factory()`` builds a fresh model (the server seeds its initialisation from ``seed``); ``federation``:
    the clients and their data; ``schedule``: how many rounds of how many clients, what failure a round tolerates
    and when to stop early; ``evaluation``: when and where the centralized test set and the clients' local splits
    are scored; ``checkpoints``: where and how often the run is saved (``None``: never); ``stages``: the optional
    stages of a round (stragglers, the simulated clock, codecs, central DP, an attack); ``logger``: where metrics go
    (``None``: kept in memory only). The groups are described in :mod:`fedsim.server.settings`. Every setting is
    checked here, before any training, with one line naming it.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Server:
        """Refuse, in one line naming where each went, the keyword arguments of the ungrouped constructor."""
        moved = [name for name in kwargs if name in MOVED]
        if moved:
            where = "; ".join(f"{name} -> {MOVED[name]}" for name in moved)
            raise TypeError(
                f"Server no longer takes {', '.join(moved)}: they moved into groups ({where}; "
                "from fedsim.server.settings, also importable from fedsim; docs/python-api.md)"
            )
        return super().__new__(cls)

    def __init__(
        self,
        *,
        model_factory: Callable[[], nn.Module],
        federation: Federation,
        strategy: Strategy,
        executor: Executor,
        schedule: Schedule,
        seed: int = 0,
        logger: RunLogger | None = None,
        evaluation: Evaluation | None = None,
        checkpoints: Checkpoints | None = None,
        stages: Stages | None = None,
    ) -> None:
        evaluation, stages = evaluation or Evaluation(), stages or Stages()
        clients, num_rounds, clients_per_round = federation.clients, schedule.num_rounds, schedule.clients_per_round
        self.stragglers = stages.stragglers or Stragglers()
        _check_settings(num_rounds, evaluation.every, clients_per_round, len(clients), self.stragglers)
        self.client_eval = evaluation.clients
        self.client_eval.check(len(clients))
        strategy.check(clients_per_round)
        self.clock = clock = stages.clock
        if clock is not None:
            clock.check(len(clients))
            check_sampling(clock, strategy)
        self.loop = event_loop(clock, strategy, len(clients), seed)  # of an asynchronous strategy (FedBuff), or None
        self.privacy = private_rounds(stages.privacy, strategy, clock, len(clients), clients_per_round, seed)
        self.model_factory, self.clients, self.strategy, self.executor = model_factory, clients, strategy, executor
        self.train_data, self.test_data = federation.train_data, federation.test_data
        self.num_rounds, self.clients_per_round, self.seed = num_rounds, clients_per_round, seed
        self.eval_every, self.min_success_fraction = evaluation.every, schedule.min_success_fraction
        self.threads = schedule.threads
        self.logger = logger or RunLogger(None)
        self.model = _initial_model(model_factory, seed)
        check_model_fits_data(self.model, federation.train_data)
        self.params = flatten(self.model)
        self._clean_clients = clients  # before a data attack replaces the malicious ones (the root data's pool)
        pipeline = build_pipeline(
            stages.compression,
            stages.attack,
            params=self.params,
            model=self.model,
            seed=seed,
            clients=clients,
            train_data=federation.train_data,
            test_data=federation.test_data,
            run_dir=self.logger.run_dir,
        )
        self.comm, self.local_dp, self.attack = pipeline.comm, pipeline.local_dp, pipeline.attack
        self.train_data, self.clients = pipeline.train_data, pipeline.clients  # a data attack's poisoned copies
        self.evaluator = DeviceEvaluator(self.model, eval_device_named(evaluation.device))
        self.checkpoint_dir = Path(checkpoints.dir) if checkpoints is not None else None
        self.checkpoint_every = checkpoints.every if checkpoints is not None else 0
        self.keep_checkpoints = checkpoints.keep if checkpoints is not None else 3
        self.start_round, self.stopped_early, self.stop_reason = 1, False, "completed"
        self._stop_requested = False
        self.early_stop = schedule.early_stop or EarlyStop()
        state_dir = self.checkpoint_dir / "client_state" if self.checkpoint_dir is not None else None
        self.client_states = ClientStateStore(federation.state_store, state_dir)
        self.local: LocalTraining | None = None  # the strategy's client half, from run()
        self.settings: dict[str, Any] = {}  # the run's settings as dotted keys, set by fedsim.cli.run (resume checks)
        strategy.setup(self.run_context())  # here, so that a strategy's objection comes before any work
        executor.check(self._workload())  # likewise the executor's (e.g. what vmap cannot vectorise)

    @property
    def finished(self) -> bool:
        """Whether every round is done already (a resume from the last round's checkpoint)."""
        return self.start_round > self.num_rounds

    @property
    def stop_requested(self) -> bool:
        """Whether :meth:`request_stop` was called: the run ends after the current round, with a checkpoint."""
        return self._stop_requested

    def request_stop(self) -> None:
        """Finish the current round, write a checkpoint and return from :meth:`run` (safe from a signal handler)."""
        self._stop_requested = True

    def run(self) -> RunResult:
        """Run the remaining rounds and return the final model; workers are released even on error.

        A checkpoint is written every ``checkpoint_every`` rounds (0: never in between), at the end,
        and when a stop was requested. When round k raises (:class:`RoundFailedError`,
        :class:`StrategyError`, an executor's error...), the checkpoint of round k-1 is written if it is
        not on disk yet, from the state as it was when round k-1 ended, and the error propagates.
        """
        with torch_threads(self.threads):
            return self._run()

    def _run(self) -> RunResult:
        if self.finished:  # a resume of a run that had already done all its rounds
            self.logger.close()
            load_flat(self.model, self.params)
            return RunResult(self.params, self.model, self.logger.history, False, "already finished")
        if self.start_round == 1:
            self.client_states.clear()  # a fresh run: whatever an earlier run left in this directory goes
        workload = self._workload()
        self.local = workload.local  # the strategy's client half for this run (what personalise() comes from)
        self.executor.start(workload)
        last_good = self._snapshot(self.start_round - 1)  # not on disk yet; what an error falls back to
        try:
            for round_num in self.logger.rounds(self.start_round, self.num_rounds):
                self.logger.log_round(round_num, self.run_round(round_num))
                self._decide_stop(round_num)
                if self._checkpoint_due(round_num):
                    self.save_checkpoint(round_num)
                    last_good = None
                else:
                    last_good = self._snapshot(round_num)
                if self.stop_reason != "completed":
                    break
        except Exception:  # a second Ctrl-C (KeyboardInterrupt) only stops; run.py reports it
            self._save_last_good(last_good)
            raise
        finally:
            self.executor.close()
            self.logger.close()
        load_flat(self.model, self.params)
        return RunResult(self.params, self.model, self.logger.history, self.stopped_early, self.stop_reason)

    def _workload(self) -> Workload:
        return Workload(
            self.model_factory,
            self.clients,
            self.train_data,
            log_dir=self.logger.run_dir,
            local=self.strategy.local_training(),
        )

    def _parts(self) -> RoundParts:
        """The run's collaborators as the round's helpers see them (built per call: it holds references only)."""
        return RoundParts(
            clients=self.clients,
            executor=self.executor,
            strategy=self.strategy,
            comm=self.comm,
            attack=self.attack,
            local_dp=self.local_dp,
            client_states=self.client_states,
            logger=self.logger,
            client_eval=self.client_eval,
            client_config=self._client_config,
            local=self.local,
            min_success_fraction=self.min_success_fraction,
            seed=self.seed,
        )

    def run_context(self) -> RunContext:
        """What the strategy is told about the run (:meth:`Strategy.setup`)."""
        return RunContext(
            layout=ParamLayout.of(self.model),
            num_clients=len(self.clients),
            num_examples=tuple(train_sizes(self.clients).tolist()),  # a Population's sizes without its clients
            clients_per_round=self.clients_per_round,
            num_rounds=self.num_rounds,
            seed=self.seed,
            run_dir=self.logger.run_dir,
            start_round=self.start_round,
            root_trainer=functools.partial(
                root_trainer, model=self.model, clients=self._clean_clients, data=self.train_data, seed=self.seed
            ),
        )

    def _decide_stop(self, round_num: int) -> None:
        """After a round: a signal interrupts the run (``stopped_early``); early stopping, or a privacy budget the next
        round would exceed, ends it."""
        if self._stop_requested and round_num < self.num_rounds:
            self.stopped_early, self.stop_reason = True, f"interrupted after round {round_num}"
            return
        early = self.early_stop.check(self.logger.history[-1])
        reason = f"early stop: {early}" if early is not None else None
        if reason is None and self.privacy is not None:
            reason = self.privacy.stop_reason(round_num + 1)
        if reason is not None and round_num < self.num_rounds:
            self.stop_reason = reason
            log.info("%s", self.stop_reason)

    def _checkpoint_due(self, round_num: int) -> bool:
        if self.checkpoint_dir is None:
            return False
        periodic = self.checkpoint_every > 0 and round_num % self.checkpoint_every == 0
        return periodic or round_num == self.num_rounds or self.stop_reason != "completed"

    def state_dict(self, round_num: int) -> dict[str, Any]:
        """Everything a resumed run needs after ``round_num``. Sampling, task seeds and stragglers are pure functions
        of (seed, round), so the round number stands for every random state."""
        return {
            "round": round_num,
            "params": self.params.clone(),
            "strategy": self.strategy.state_dict(),
            "history": without_client_rows(self.logger.history),  # the rows live in metrics.jsonl
            "client_state_round": self.client_states.round,  # its entries live in client_state/, versioned
            "fingerprint": self._fingerprint(),
            "settings": self.settings,  # what a resume may not change silently (fedsim.server.resume_check)
            **{key: part.state_dict() for key, part in self._checkpoint_parts(round_num).items()},
        }

    def _fingerprint(self) -> dict[str, int]:
        return {
            "seed": self.seed,
            "num_clients": len(self.clients),
            "clients_per_round": self.clients_per_round,
            "num_params": self.params.numel(),
        }

    def save_checkpoint(self, round_num: int, state: dict[str, Any] | None = None) -> Path:
        """Write the checkpoint of ``round_num``: ``state`` (an earlier :meth:`state_dict`), else the current state."""
        assert self.checkpoint_dir is not None
        state = self._with_manifest(self.state_dict(round_num) if state is None else state)
        path = save_checkpoint(self.checkpoint_dir, round_num, state, keep=self.keep_checkpoints)
        log.info("round %d: checkpoint %s", round_num, path)
        return path

    def resume(self, target: str | Path, allow_changes: Sequence[str] = ()) -> Path:
        """Continue from a checkpoint file, a checkpoints directory or a run directory (newest good checkpoint).
        Settings that change the computation must be the checkpoint's, except those in ``allow_changes``
        (see :mod:`fedsim.server.resume_check`)."""
        path, state = resolve_checkpoint(target)
        changes = check_changes(state.get("settings", {}), self.settings, allow_changes, path)  # names a changed key
        check_fingerprint(state.get("fingerprint"), self._fingerprint(), path)  # the Python API has no settings
        self.params = state["params"].to(self.params.dtype)
        self.start_round = int(state["round"]) + 1
        self.strategy.setup(self.run_context())  # told again, before its state comes back
        try:
            self.strategy.load_state_dict(state["strategy"])
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CheckpointError(
                f"{path}: its strategy state does not fit {type(self.strategy).__name__} ({type(error).__name__}: "
                f"{error}); resume with the strategy the run was started with"
            ) from None
        restore_parts(path, state, self._checkpoint_parts(self.start_round))
        if self.finished:
            log.info("%s is of round %d: the run is finished, nothing to do", path, self.start_round - 1)
            return path  # nothing else is touched
        continue_records(
            path,
            state,
            changes,
            start_round=self.start_round,
            client_states=self.client_states,
            logger=self.logger,
            early_stop=self.early_stop,
        )
        log.info("resumed from %s: continuing at round %d", path, self.start_round)
        return path

    def run_round(self, round_num: int) -> dict[str, float]:
        """One round (:mod:`fedsim.server.round`); returns its metrics. Updates ``self.params`` unless no client
        succeeded."""
        record = RoundRecord(round_num, self.params, time.perf_counter(), self.params)
        try:
            run_stages(self._stages(round_num), record)
        finally:  # the weights the round got to, also when a later stage fails (as the round's own state)
            self.params = record.params
        return record.metrics

    def _checkpoint_parts(self, round_num: int) -> dict[str, Stateful]:
        """The stateful parts the round's stages own, by checkpoint entry (the clock, the byte ledger, ...)."""
        return checkpoint_parts(self._stages(round_num))

    def _stages(self, round_num: int) -> list[RoundStage]:
        """The round's stages, built from the server's parts as they are now."""
        parts = self._parts()
        evaluate = Evaluate(
            central=self._evaluate_params,
            clients=functools.partial(evaluate_clients, parts),
            central_due=self._central_eval_due(round_num),
            clients_due=self.client_eval.due(round_num, self.eval_every, self.num_rounds),
        )
        commit = CommitStates(self.client_states, self.checkpoint_dir)
        if self.loop is not None:  # an asynchronous strategy (FedBuff): one server step on the clock
            return [BufferedStep(self.loop, parts), commit, MeasureStep(parts), evaluate]
        plan = Plan(
            self.strategy,
            self.clients,
            self.clients_per_round,
            self.seed,
            self._client_config,
            self.comm,
            self.clock,
            self.privacy,
        )
        return [
            plan,
            Dispatch(self.executor, self.comm, self.client_states, self.attack, self.seed),
            Receive(self.logger, self.min_success_fraction, self.strategy, self.stragglers),
            Aggregate(self.strategy, self.logger, self.privacy),
            commit,
            Measure(parts),
            *([AdvanceClock(self.clock)] if self.clock is not None else []),
            evaluate,
        ]

    def _client_config(self, round_num: int, client_id: int) -> dict[str, Any]:
        """The strategy's per-client config, with fewer epochs for a simulated straggler."""
        config = self.strategy.client_config(round_num, client_id)
        epochs = self.stragglers.epochs_for(round_num, client_id)
        return config if epochs is None else {**config, "epochs": epochs}

    def _central_eval_due(self, round_num: int) -> bool:
        return round_num % self.eval_every == 0 or round_num == self.num_rounds

    def evaluate(self) -> dict[str, float]:
        """Loss and accuracy of the current global model on the centralized test set."""
        return self._evaluate_params(self.params)

    def _evaluate_params(self, params: torch.Tensor) -> dict[str, float]:
        """Loss and accuracy of ``params`` on the centralized test set (and an attack's backdoor success); for a
        language model's token labels, token loss, token accuracy and perplexity."""
        if self.test_data is None or len(self.test_data) == 0:
            return {}
        model = self.evaluator.load(params)
        result = evaluate_indices(model, self.evaluator.on_device(self.test_data))
        backdoor = (
            self.attack.evaluate(lambda d: evaluate_indices(model, self.evaluator.on_device(d))["accuracy"])
            if self.attack
            else {}
        )
        perplexity = {"eval/perplexity": result["perplexity"]} if "perplexity" in result else {}  # token labels
        return {"eval/loss": result["loss"], "eval/accuracy": result["accuracy"]} | perplexity | backdoor

    def evaluate_clients(self, round_num: int, sampled: Sequence[int]) -> dict[str, float]:
        """Federated evaluation of the clients ``evaluate_clients`` names (``sampled``: this round's): see
        :func:`fedsim.server.federated_eval.evaluate_clients`."""
        return evaluate_clients(self._parts(), self.params, round_num, sampled)

    def _snapshot(self, round_num: int) -> dict[str, Any] | None:
        """:meth:`state_dict` after ``round_num`` (cloned), kept in memory in case the next round fails; ``None``
        without checkpoints or before round 1."""
        return self.state_dict(round_num) if self.checkpoint_dir is not None and round_num >= 1 else None

    def _save_last_good(self, state: dict[str, Any] | None) -> None:
        """After an error: write the last completed round's checkpoint unless it is on disk already."""
        if state is not None and self.checkpoint_dir is not None:
            save_if_missing(self.checkpoint_dir, state["round"], self._with_manifest(state), keep=self.keep_checkpoints)

    def _with_manifest(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` with the client-state versions its round reads (what a resume checks before the first round);
        listed when the checkpoint is written, not per round, since it grows with the clients that have a state."""
        return state | {"client_state_manifest": self.client_states.manifest(state["client_state_round"])}
