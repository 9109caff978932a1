"""Composition root: turns a Hydra config into a Server and runs it. The only place that calls instantiate.

From the command line: ``python -m fedsim [overrides]`` (or the ``fedsim`` console script; see
:mod:`fedsim.cli.command`).
From Python: ``run_config(compose(["strategy=fedavg", "num_rounds=5"]), run_dir="out")``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fedsim.attacks.base import Attack
from fedsim.cli.config import ConfigError, register_schema, to_yaml, validate
from fedsim.cli.config_dir import config_dir
from fedsim.cli.run_dir_guard import removing_new_files
from fedsim.cli.run_summary import flat_hparams, record_error, record_summary
from fedsim.cli.run_tokenizer import tokenizer_setting, trained_tokenizer
from fedsim.cli.secagg_option import build_secagg, prepare_secagg
from fedsim.client.evaluation import ClientEvaluation
from fedsim.client.federation import FederatedData, federate, make_population
from fedsim.comm.names import codec_from
from fedsim.comm.pipeline import Compression
from fedsim.core.checkpoint import check_writable, list_checkpoints
from fedsim.core.progress import configure as configure_progress
from fedsim.core.run_lock import hold
from fedsim.core.seeding import partition_seed
from fedsim.executor.base import Executor
from fedsim.models.hf_lm import with_adapter
from fedsim.observe.trackers import TrackedLogger, make_logger
from fedsim.privacy.central import CentralDP
from fedsim.server.early_stop import EarlyStop
from fedsim.server.resume_check import computation_settings
from fedsim.server.server import RunResult, Server
from fedsim.server.settings import Checkpoints, Evaluation, Federation, Schedule, Stages
from fedsim.server.stage import RoundStage
from fedsim.server.stragglers import Stragglers
from fedsim.sim.clock import SyncClock
from fedsim.strategy.base import Strategy

CONFIG_DIR = config_dir()
log = logging.getLogger("fedsim")
register_schema()


def compose(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """Compose ``conf/config.yaml`` with command-line style overrides, without running anything."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=list(overrides))


def _instantiate(node: DictConfig, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate`` (``kwargs`` override the node's), but a component's own error surfaces as itself
    (one clear line), not wrapped in Hydra's InstantiationException."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as error:
        if isinstance(error.__cause__, (ValueError, FileNotFoundError)):
            raise error.__cause__ from None
        raise


def _instantiate_a(node: DictConfig, kind: type, group: str, base: str) -> Any:
    """:func:`_instantiate`, refusing in one line a ``_target_`` that builds something other than ``kind``."""
    built = _instantiate(node)
    if not isinstance(built, kind):
        raise ConfigError(
            f"{group}._target_={node.get('_target_')} builds a {type(built).__name__}, not a {base}; "
            f"point it at a subclass of {base}"
        )
    return built


def build_data(cfg: DictConfig, run_dir: str | Path | None = None) -> FederatedData:
    """Load the dataset and partition it over clients; with ``data.tokenizer=train``, the tokenizer is saved in
    ``run_dir`` or read back from it (:func:`~fedsim.cli.run_tokenizer.trained_tokenizer`)."""
    split = _instantiate(cfg.data, **trained_tokenizer(cfg, run_dir, resume_target(cfg.resume, run_dir)))
    partition = _instantiate(cfg.partition)
    return federate(split, partition, client_test_fraction=cfg.client_test_fraction, seed=partition_seed(cfg.seed))


def build_model_factory(cfg: DictConfig, data: FederatedData) -> Callable[[], Any]:
    """The model's constructor with ``input_shape`` and ``num_classes`` taken from the data (the option file
    must make a ``_partial_`` node, or the call would miss them), and ``vocab_size`` too when the data has one
    (:attr:`~fedsim.data.tensor_data.TensorData.vocab_size`) and the model's is null."""
    if cfg.model.get("_partial_") is not True:
        raise ConfigError(
            f"model: the option for {cfg.model.get('_target_')} needs `_partial_: true` (fedsim passes "
            "input_shape and num_classes from the data); add `_partial_: true` to the model's option file"
        )
    dtype = cfg.model.get("dtype", "float32")
    if cfg.adapter.get("_target_") is None and dtype in ("bfloat16", "float16"):
        raise ConfigError(
            f"model.dtype={dtype} is the frozen base's dtype of a LoRA run, and adapter=none trains every weight; "
            f"use adapter=lora, or model.dtype=float32 with client.autocast={dtype} for mixed precision"
        )
    shapes: dict[str, Any] = {"input_shape": data.train.input_shape, "num_classes": data.train.num_classes}
    if data.train.vocab_size is not None and "vocab_size" in cfg.model and cfg.model.vocab_size is None:
        shapes["vocab_size"] = data.train.vocab_size  # a text classifier's tokens: the tokenizer's vocabulary
    if cfg.adapter.get("_target_") is None:
        return functools.partial(_instantiate(cfg.model), **shapes)
    return functools.partial(with_adapter, _instantiate(cfg.model), _instantiate(cfg.adapter), **shapes)


def build_compression(cfg: DictConfig) -> Compression:
    """The codecs of ``cfg.compression`` (entries: names, names with arguments, or ``_target_`` dicts; see
    :mod:`fedsim.comm.names`)."""
    node = cfg.compression

    def chain(direction: str) -> list[Any]:
        entries = node.get(direction) or []
        if not OmegaConf.is_list(entries) and not isinstance(entries, list):
            raise ConfigError(f"compression.{direction} must be a list of codecs, e.g. [topk, fp16] (got {entries!r})")
        plain = OmegaConf.to_container(entries, resolve=True) if OmegaConf.is_list(entries) else entries
        return [
            codec_from(
                e, f"compression.{direction}[{i}]", lambda d: _instantiate(OmegaConf.create(cast(dict[str, Any], d)))
            )
            for i, e in enumerate(cast(list[Any], plain))
        ]

    return Compression(
        uplink=chain("uplink"), downlink=chain("downlink"), error_feedback=bool(node.get("error_feedback", False))
    )


def build_privacy(cfg: DictConfig) -> CentralDP | None:
    """DP-FedAvg as ``cfg.dp`` configures it, or None (``dp=none``)."""
    if cfg.dp.get("_target_") is None:
        return None
    return _instantiate_a(cfg.dp, CentralDP, "dp", "fedsim.privacy.CentralDP")


def build_attack(cfg: DictConfig) -> Attack | None:
    """The attack of ``cfg.attack``, or None (``attack=none``)."""
    if cfg.attack.get("_target_") is None:
        return None
    return _instantiate_a(cfg.attack, Attack, "attack", "fedsim.attacks.Attack")


def build_extra_stages(cfg: DictConfig) -> list[RoundStage]:
    """The stages of ``round.extra``, each built from its ``_target_`` entry; an entry's ``position`` and ``name``
    (optional) are set on the stage instead of being passed to its constructor."""
    stages = []
    for i, entry in enumerate(cfg.round.extra or []):
        node = OmegaConf.to_container(entry, resolve=True)
        assert isinstance(node, dict)  # validate() refused anything else
        placed = {key: node.pop(key) for key in ("position", "name") if key in node}
        stage = _instantiate_a(OmegaConf.create(node), RoundStage, f"round.extra[{i}]", "fedsim.server.RoundStage")
        for key, value in placed.items():
            object.__setattr__(stage, key, value)  # also on a frozen dataclass: the entry says where it goes
        stages.append(stage)
    return stages


def build_clock(cfg: DictConfig, num_clients: int) -> SyncClock | None:
    """The simulated clock of ``cfg.clock`` for ``num_clients`` clients, or None (``clock=none``)."""
    if cfg.clock.get("_target_") is None:
        return None
    if cfg.clock.get("_partial_") is not True:
        raise ConfigError("clock: the option needs `_partial_: true` (fedsim passes num_clients and seed)")
    clock = _instantiate(cfg.clock)(num_clients=num_clients, seed=cfg.seed)
    if not isinstance(clock, SyncClock):
        raise ConfigError(
            f"clock._target_={cfg.clock._target_} builds a {type(clock).__name__}, not a fedsim.sim.clock.SyncClock"
        )
    return clock


def build_server(cfg: DictConfig, run_dir: str | Path | None = None) -> Server:
    """Validate ``cfg`` and build every component; raises ``ConfigError``/``ValueError``/``FileNotFoundError``
    with a one-line message before any training starts, and then leaves no file of the run behind
    (:mod:`fedsim.cli.run_dir_guard`)."""
    validate(cfg)
    configure_progress(cfg.logger.progress, cfg.logger.get("progress_after", 3))
    with removing_new_files(run_dir) as on_failure:  # files are created from here on, and later checks may still refuse
        if run_dir is not None:
            check_writable(run_dir)
        data, parts = _components(cfg, run_dir)
        logger = make_logger(
            cfg, run_dir, tensorboard=cfg.logger.tensorboard, progress=cfg.logger.progress, client_rows_in_memory=False
        )
        on_failure.append(logger.close)
        server = Server(logger=logger, **parts)
        on_failure.append(server.parts.executor.close)  # the workers Server started building models (prepare)
        prepare_secagg(parts["stages"].extra, server.params.numel())  # distributed DP's z, before any round
        logger.log_label_distribution(label_counts(data))  # drawn once the round's checks above have passed
        server.settings = computation_settings(flat_hparams(cfg)) | tokenizer_setting(cfg, run_dir)
        resume = resume_target(cfg.resume, run_dir)
        if resume is not None:
            server.resume(resume, allow_changes=list(cfg.resume_allow_changes or []))
        else:
            logger.log_config(to_yaml(cfg))
        if isinstance(logger, TrackedLogger):
            logger.start()  # a tracker that cannot start stops the run here, before any training
    return server


def _components(cfg: DictConfig, run_dir: str | Path | None) -> tuple[FederatedData, dict[str, Any]]:
    """The data, and every :class:`Server` argument but the logger, built from ``cfg`` (none of them writes a file)."""
    executor = _instantiate_a(cfg.executor, Executor, "executor", "fedsim.executor.Executor")  # first: see process.py
    data = build_data(cfg, run_dir)
    clients = make_population(data, _instantiate(cfg.client))  # built when sampled (issue #35)
    model_factory = build_model_factory(cfg, data)
    strategy = _instantiate_a(cfg.strategy, Strategy, "strategy", "fedsim.strategy.Strategy")
    clock = build_clock(cfg, len(clients))
    # before central DP's accountant is loaded: it may refuse it; it times its protocol on the clock
    secagg = build_secagg(cfg, strategy, _instantiate, clock=clock, num_clients=len(clients))
    return data, dict(
        model_factory=model_factory,
        federation=Federation(clients, data.train, data.test, state_store=cfg.state_store),
        strategy=strategy,
        executor=executor,
        schedule=Schedule(
            num_rounds=cfg.num_rounds,
            clients_per_round=cfg.clients_per_round,
            min_success_fraction=cfg.min_success_fraction,
            early_stop=EarlyStop(cfg.early_stop.target_accuracy, cfg.early_stop.patience),
            threads=cfg.server_threads,
        ),
        seed=cfg.seed,
        evaluation=Evaluation(
            every=cfg.eval_every,
            device=cfg.eval_device,
            clients=ClientEvaluation(cfg.evaluate_clients.who, cfg.evaluate_clients.size, cfg.evaluate_clients.every),
        ),
        checkpoints=(
            Checkpoints(Path(run_dir) / "checkpoints", every=cfg.checkpoint_every, keep=cfg.keep_checkpoints)
            if run_dir is not None
            else None
        ),
        stages=Stages(
            stragglers=Stragglers(fraction=cfg.stragglers.fraction, epochs=cfg.stragglers.epochs, seed=cfg.seed),
            clock=clock,
            compression=build_compression(cfg),
            privacy=build_privacy(cfg),
            attack=build_attack(cfg),
            extra=secagg + build_extra_stages(cfg),
        ),
    )


def resume_target(resume: Any, run_dir: str | Path | None) -> str | Path | None:
    """What to resume from: ``run_dir`` for ``resume=true``; for ``resume=auto`` that too if it holds a checkpoint,
    else nothing (a fresh start: a requeued job that had not checkpointed yet); a path as given."""
    if resume in (None, False):
        return None
    if resume is True or resume == "auto":
        if run_dir is None:
            raise ConfigError(
                f"resume={str(resume).lower()} needs a run directory; pass resume=<checkpoint or run directory>"
            )
        if resume == "auto" and not list_checkpoints(Path(run_dir) / "checkpoints"):
            log.info("resume=auto: no checkpoint in %s yet; starting the run from round 1", run_dir)
            return None
        return run_dir
    return resume


def label_counts(data: FederatedData, max_clients: int = 200) -> np.ndarray:
    """Examples per class of the first ``max_clients`` clients' training parts (clients × classes); for text data
    with a category column (what its partitioners split by), examples per category."""
    labels = data.train.labels
    if labels.ndim != 1:  # token labels (a language model's data) without categories: no class per example
        return np.zeros((0, data.train.num_classes))
    classes = data.train.num_classes if data.train.categories is None else int(labels.max(initial=-1)) + 1
    return (
        np.stack([np.bincount(labels[idx], minlength=classes) for idx in data.client_train[:max_clients]])
        if data.num_clients
        else np.zeros((0, classes))
    )


def run_config(cfg: DictConfig, run_dir: str | Path | None = None) -> RunResult:
    """Build and run one configuration; writes ``summary.json`` into ``run_dir`` when given. The run holds
    ``run_dir`` from start to end: another process's run there is refused before anything is written
    (:class:`~fedsim.core.run_lock.RunDirectoryInUse`)."""
    with hold(run_dir) if run_dir is not None else contextlib.nullcontext():
        return _run_config(cfg, run_dir)


def _run_config(cfg: DictConfig, run_dir: str | Path | None) -> RunResult:
    start = time.perf_counter()
    server = build_server(cfg, run_dir)
    if server.finished:
        log.info(
            "resume: the run had finished all %d rounds; nothing to do (summary.json unchanged)", server.num_rounds
        )
        return server.run()
    try:
        result = server.run()
    except Exception as error:  # summary.json says so (finished: false); the last good checkpoint stays
        record_error(server, cfg, run_dir, time.perf_counter() - start, error)
        raise
    summary = record_summary(server, result, cfg, run_dir, time.perf_counter() - start)
    tokens = "final_perplexity" in summary  # a token task: perplexity first
    log.info(
        "final test %s %.4f%s after %d rounds (%.1f s)",
        "perplexity" if tokens else "accuracy",
        summary["final_perplexity"] if tokens else summary["final_accuracy"] or float("nan"),
        f" (token accuracy {summary['final_accuracy']:.4f})" if tokens else "",
        summary["rounds"],
        summary["wall_time_s"],
    )
    return result


__all__ = ["ConfigError", "build_server", "compose", "run_config"]
