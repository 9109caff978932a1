"""Run-level configuration schema and validation (with run.py, the only module that knows Hydra).

Hydra checks types against :class:`RunSchema`; :func:`validate` checks ranges and cross-field rules
and raises :class:`ConfigError` with one line that names the field and what to do, before any work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from fedsim.cli.config_keys import check_keys
from fedsim.cli.config_numbers import check_numbers
from fedsim.cli.objective import METRIC_NAME, REDUCTIONS
from fedsim.core.errors import ConfigError


@dataclass
class StragglerSchema:
    """Simulated stragglers (FedProx paper): this share of sampled clients does 1..epochs-1 epochs."""

    fraction: float = 0.0
    epochs: int = 1


@dataclass
class EarlyStopSchema:
    """Optional early stop on the centralized test accuracy."""

    target_accuracy: float | None = None
    patience: int | None = None


@dataclass
class ObjectiveSchema:
    """What ``python -m fedsim`` returns to a Hydra sweeper (see fedsim/cli/objective.py)."""

    metric: str = "eval/accuracy"
    reduce: str = "final"


@dataclass
class ClientEvalSchema:
    """Who is scored on their local test splits, and how often (see fedsim/client/evaluation.py)."""

    who: str = "sampled"
    size: int | None = None
    every: int | None = None


@dataclass
class RunSchema:
    """Types of the run-level fields. Group sections stay free-form: their ``_target_`` decides."""

    seed: int = 0
    num_rounds: int = 30
    clients_per_round: int = 10
    eval_every: int = 1
    eval_device: str = "auto"
    client_test_fraction: float = 0.2
    min_success_fraction: float = 1.0
    checkpoint_every: int = 0
    keep_checkpoints: int = 3
    state_store: str = "memory"
    server_threads: int | None = 1
    resume: Any = None
    resume_allow_changes: list[str] = field(default_factory=list)
    data: Any = field(default_factory=dict)
    partition: Any = field(default_factory=dict)
    model: Any = field(default_factory=dict)
    client: Any = field(default_factory=dict)
    strategy: Any = field(default_factory=dict)
    executor: Any = field(default_factory=dict)
    logger: Any = field(default_factory=dict)
    tracker: Any = field(default_factory=dict)
    clock: Any = field(default_factory=dict)
    compression: Any = field(default_factory=dict)
    dp: Any = field(default_factory=dict)
    attack: Any = field(default_factory=dict)
    stragglers: StragglerSchema = field(default_factory=lambda: StragglerSchema())
    early_stop: EarlyStopSchema = field(default_factory=lambda: EarlyStopSchema())
    objective: ObjectiveSchema = field(default_factory=lambda: ObjectiveSchema())
    evaluate_clients: ClientEvalSchema = field(default_factory=lambda: ClientEvalSchema())


def register_schema() -> None:
    """Make ``fedsim_schema`` available to the defaults list of ``conf/config.yaml``."""
    ConfigStore.instance().store(name="fedsim_schema", node=RunSchema)


def _require(ok: bool, name: str, rule: str, value: object, hint: str = "") -> None:
    if not ok:
        raise ConfigError(f"{name} {rule} (got {value!r}){'; ' + hint if hint else ''}")


def _number(section: DictConfig, key: str) -> float | None:
    value = section.get(key) if isinstance(section, DictConfig) else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def validate(cfg: DictConfig) -> None:
    """Check keys, types, ranges and cross-field rules of a composed config; raise :class:`ConfigError` on the first
    problem."""
    check_keys(cfg, RunSchema, ConfigError)
    check_numbers(cfg, ConfigError)
    _validate_run(cfg)
    _validate_client(cfg.client)
    _require(0 <= cfg.stragglers.fraction <= 1, "stragglers.fraction", "must be in [0, 1]", cfg.stragglers.fraction)
    _require(cfg.stragglers.epochs >= 1, "stragglers.epochs", "must be >= 1", cfg.stragglers.epochs)
    target, patience = cfg.early_stop.target_accuracy, cfg.early_stop.patience
    _require(target is None or 0 < target <= 1, "early_stop.target_accuracy", "must be in (0, 1] or null", target)
    _require(patience is None or patience >= 1, "early_stop.patience", "must be >= 1 or null", patience)
    _validate_data_and_partition(cfg)


def _validate_run(cfg: DictConfig) -> None:
    _require(cfg.seed >= 0, "seed", "must be >= 0", cfg.seed)
    _require(cfg.num_rounds >= 1, "num_rounds", "must be >= 1", cfg.num_rounds)
    _require(cfg.clients_per_round >= 1, "clients_per_round", "must be >= 1", cfg.clients_per_round)
    _require(cfg.eval_every >= 1, "eval_every", "must be >= 1", cfg.eval_every)
    _check_eval_device(cfg.eval_device)
    _require(0 <= cfg.client_test_fraction < 1, "client_test_fraction", "must be in [0, 1)", cfg.client_test_fraction)
    _require(0 < cfg.min_success_fraction <= 1, "min_success_fraction", "must be in (0, 1]", cfg.min_success_fraction)
    _require(cfg.checkpoint_every >= 0, "checkpoint_every", "must be >= 0 (0: only at the end)", cfg.checkpoint_every)
    _require(cfg.keep_checkpoints >= 1, "keep_checkpoints", "must be >= 1", cfg.keep_checkpoints)
    _require(cfg.state_store in ("memory", "disk"), "state_store", "must be memory or disk", cfg.state_store)
    _require(
        cfg.server_threads is None or cfg.server_threads >= 1,
        "server_threads",
        "must be >= 1 or null",
        cfg.server_threads,
    )
    _require(
        cfg.resume is None or isinstance(cfg.resume, (bool, str)),
        "resume",
        "must be true, false, auto or a path",
        cfg.resume,
    )
    _require(
        cfg.objective.reduce in REDUCTIONS,
        "objective.reduce",
        f"must be one of {', '.join(REDUCTIONS)}",
        cfg.objective.reduce,
    )
    _require(
        bool(METRIC_NAME.fullmatch(cfg.objective.metric)),
        "objective.metric",
        "must be a metric name such as eval/accuracy or eval/loss",
        cfg.objective.metric,
    )


def _check_eval_device(name: str) -> None:
    from fedsim.server.central_eval import eval_device  # torch is imported anyway by the time a run is validated

    try:
        eval_device(name)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _validate_client(client: DictConfig) -> None:
    for key in ("epochs", "batch_size"):
        value = _number(client, key)
        if value is not None:
            _require(value >= 1 and float(value).is_integer(), f"client.{key}", "must be an integer >= 1", value)
    optimizer = client.get("optimizer")
    if isinstance(optimizer, DictConfig):
        lr = _number(optimizer, "lr")
        if lr is not None:
            _require(lr > 0, "client.optimizer.lr", "must be > 0", lr, "e.g. client.optimizer.lr=0.01")
        for key in ("momentum", "weight_decay"):
            value = _number(optimizer, key)
            if value is not None:
                _require(value >= 0, f"client.optimizer.{key}", "must be >= 0", value)


def _validate_data_and_partition(cfg: DictConfig) -> None:
    devices = _number(cfg.data, "num_devices")
    if devices is not None:
        _require(devices >= 1, "data.num_devices", "must be >= 1", devices)
    for key in ("alpha", "beta"):
        value = _number(cfg.data, key)
        if value is not None:
            _require(value >= 0, f"data.{key}", "must be >= 0", value)
    alpha = _number(cfg.partition, "alpha")
    if alpha is not None:
        _require(alpha > 0, "partition.alpha", "must be > 0", alpha, "smaller alpha means more label skew, e.g. 0.1")
    for key in ("num_clients", "shards_per_client"):
        value = _number(cfg.partition, key)
        if value is not None:
            _require(value >= 1, f"partition.{key}", "must be >= 1", value)
    num_clients = _number(cfg.partition, "num_clients")
    uses_groups = str(cfg.partition.get("_target_", "")).endswith((".natural", ".auto"))
    if uses_groups and _number(cfg.data, "num_devices") is not None:
        num_clients = _number(cfg.data, "num_devices")
    if num_clients is not None:
        _require(
            cfg.clients_per_round <= num_clients,
            "clients_per_round",
            f"must be <= the {int(num_clients)} clients",
            cfg.clients_per_round,
        )


def to_yaml(cfg: DictConfig) -> str:
    """The resolved configuration as YAML text (for logs and TensorBoard)."""
    return OmegaConf.to_yaml(cfg, resolve=True)
