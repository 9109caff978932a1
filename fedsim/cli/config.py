"""Run-level configuration schema and validation (with run.py, the only module that knows Hydra).

Hydra checks types against :class:`RunSchema` (a wrong type is one line from :func:`schema_rule`, see
:mod:`fedsim.cli.override_errors`); :func:`validate` checks ranges (:data:`RANGES`) and cross-field rules and
raises :class:`ConfigError` with one line that names the field and what to do, before any work. Group sections are
checked by the constructors they configure (:mod:`fedsim.cli.config_keys`, :mod:`fedsim.cli.config_numbers`, and
the classes' own range checks, which name the config keys); the sections without a ``_target_`` (compression,
evaluate_clients) and what fedsim/observe's trackers leave unchecked are checked here.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from fedsim.cli.config_keys import check_keys, check_section
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
class RoundSchema:
    """Stages of one's own (docs/writing-a-round-step.md): each entry ``{_target_: module.Class, ...}``, with optional
    ``position`` and ``name`` overriding the class's."""

    extra: list[Any] = field(default_factory=list)


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
    adapter: Any = field(default_factory=dict)
    client: Any = field(default_factory=dict)
    strategy: Any = field(default_factory=dict)
    executor: Any = field(default_factory=dict)
    logger: Any = field(default_factory=dict)
    tracker: Any = field(default_factory=dict)
    clock: Any = field(default_factory=dict)
    compression: Any = field(default_factory=dict)
    dp: Any = field(default_factory=dict)
    attack: Any = field(default_factory=dict)
    secagg: Any = field(default_factory=dict)
    stragglers: StragglerSchema = field(default_factory=lambda: StragglerSchema())
    early_stop: EarlyStopSchema = field(default_factory=lambda: EarlyStopSchema())
    objective: ObjectiveSchema = field(default_factory=lambda: ObjectiveSchema())
    evaluate_clients: ClientEvalSchema = field(default_factory=lambda: ClientEvalSchema())
    round: RoundSchema = field(default_factory=lambda: RoundSchema())


RANGES: dict[str, str] = {  # the allowed values of each number of the schema, as "<key> must be <range>" says them
    "seed": ">= 0",
    "num_rounds": ">= 1",
    "clients_per_round": ">= 1",
    "eval_every": ">= 1",
    "client_test_fraction": "in [0, 1)",
    "min_success_fraction": "in (0, 1]",
    "checkpoint_every": ">= 0 (0: only at the end)",
    "keep_checkpoints": ">= 1",
    "server_threads": ">= 1 or null",
    "stragglers.fraction": "in [0, 1]",
    "stragglers.epochs": ">= 1",
    "early_stop.target_accuracy": "in (0, 1] or null",
    "early_stop.patience": ">= 1 or null",
    "evaluate_clients.size": ">= 1 (with evaluate_clients=cohort) or null",
    "evaluate_clients.every": ">= 1 or null",
}


def schema_rule(key: str) -> str | None:
    """What the schema field ``key`` (dotted, e.g. ``stragglers.fraction``) takes, as it follows "must be":
    ``an integer >= 1``, ``a number in [0, 1]``, ``a string``; ``None`` for a key the schema does not type."""
    schema: Any = RunSchema
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not is_dataclass(schema) or part not in {f.name for f in fields(schema)}:
            return None
        hint = typing.get_type_hints(schema)[part]
        if i < len(parts) - 1:
            schema = hint
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)
    if optional:
        others = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = others[0] if len(others) == 1 else Any
    kind = {int: "an integer", float: "a number", str: "a string", list: "a list"}.get(typing.get_origin(hint) or hint)
    if kind is None:
        return None
    rule = RANGES.get(key)
    if rule is not None:
        return f"{kind} {rule}"
    return f"{kind} or null" if optional else kind


def register_schema() -> None:
    """Make ``fedsim_schema`` available to the defaults list of ``conf/config.yaml``."""
    ConfigStore.instance().store(name="fedsim_schema", node=RunSchema)


def _require(ok: bool, name: str, rule: str, value: object, hint: str = "") -> None:
    if not ok:
        raise ConfigError(f"{name} {rule} (got {value!r}){'; ' + hint if hint else ''}")


def _in_range(ok: bool, key: str, value: object) -> None:
    """:func:`_require` with the rule of :data:`RANGES`."""
    _require(ok, key, f"must be {RANGES[key]}", value)


def _number(section: DictConfig, key: str) -> float | None:
    value = section.get(key) if isinstance(section, DictConfig) else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def validate(cfg: DictConfig) -> None:
    """Check keys, types, ranges and cross-field rules of a composed config; raise :class:`ConfigError` on the first
    problem."""
    missing = _first_missing(OmegaConf.to_container(cfg, resolve=False), "")
    if missing is not None:
        raise ConfigError(f"{missing} has no value (??? in its option file); give it, e.g. {missing}=<value>")
    check_keys(cfg, RunSchema, ConfigError)
    check_numbers(cfg, ConfigError)
    _validate_run(cfg)
    _validate_client(cfg.client)
    _in_range(0 <= cfg.stragglers.fraction <= 1, "stragglers.fraction", cfg.stragglers.fraction)
    _in_range(cfg.stragglers.epochs >= 1, "stragglers.epochs", cfg.stragglers.epochs)
    target, patience = cfg.early_stop.target_accuracy, cfg.early_stop.patience
    _in_range(target is None or 0 < target <= 1, "early_stop.target_accuracy", target)
    _in_range(patience is None or patience >= 1, "early_stop.patience", patience)
    _validate_data_and_partition(cfg)
    _validate_evaluate_clients(cfg.evaluate_clients)
    _validate_compression(cfg.compression)
    _validate_tracker(cfg.tracker)
    _validate_round(cfg.round)


def _first_missing(node: Any, path: str) -> str | None:
    """The dotted key of the first mandatory value (``???``) left unset in ``node`` (a plain container, its
    interpolations unresolved: resolving one that reads a bad value would fail before that value is named)."""
    if isinstance(node, dict):
        items: list[tuple[str, Any]] = [(f"{path}.{key}" if path else str(key), v) for key, v in node.items()]
    elif isinstance(node, list):
        items = [(f"{path}[{i}]", v) for i, v in enumerate(node)]
    else:
        return path if node == "???" else None
    for where, value in items:
        found = _first_missing(value, where)
        if found is not None:
            return found
    return None


def _validate_run(cfg: DictConfig) -> None:
    _in_range(cfg.seed >= 0, "seed", cfg.seed)
    _in_range(cfg.num_rounds >= 1, "num_rounds", cfg.num_rounds)
    _in_range(cfg.clients_per_round >= 1, "clients_per_round", cfg.clients_per_round)
    _in_range(cfg.eval_every >= 1, "eval_every", cfg.eval_every)
    _check_eval_device(cfg.eval_device)
    _in_range(0 <= cfg.client_test_fraction < 1, "client_test_fraction", cfg.client_test_fraction)
    _in_range(0 < cfg.min_success_fraction <= 1, "min_success_fraction", cfg.min_success_fraction)
    _in_range(cfg.checkpoint_every >= 0, "checkpoint_every", cfg.checkpoint_every)
    _in_range(cfg.keep_checkpoints >= 1, "keep_checkpoints", cfg.keep_checkpoints)
    _require(cfg.state_store in ("memory", "disk"), "state_store", "must be memory or disk", cfg.state_store)
    _in_range(cfg.server_threads is None or cfg.server_threads >= 1, "server_threads", cfg.server_threads)
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
    for key in ("epochs", "batch_size", "local_steps"):
        value = _number(client, key)
        if value is not None:
            rule = "must be an integer >= 1" + (" or null (null: client.epochs)" if key == "local_steps" else "")
            _require(value >= 1 and float(value).is_integer(), f"client.{key}", rule, value)
    schedule = client.get("lr_schedule")
    if isinstance(schedule, DictConfig) and str(schedule.get("_target_", "")).endswith("LrSchedule"):
        _validate_lr_schedule(schedule)
    optimizer = client.get("optimizer")
    if isinstance(optimizer, DictConfig):
        lr = _number(optimizer, "lr")
        if lr is not None:
            _require(lr > 0, "client.optimizer.lr", "must be > 0", lr, "e.g. client.optimizer.lr=0.01")
        for key in ("momentum", "weight_decay"):
            value = _number(optimizer, key)
            if value is not None:
                _require(value >= 0, f"client.optimizer.{key}", "must be >= 0", value)


def _validate_lr_schedule(schedule: DictConfig) -> None:
    """``client.lr_schedule``'s rules (:class:`~fedsim.client.schedule.LrSchedule`'s), before the data is loaded."""
    from fedsim.client.schedule import LrSchedule

    values = {k: schedule[k] for k in ("kind", "gamma", "step_rounds", "min_lr", "num_rounds") if k in schedule}
    try:
        LrSchedule(**values)
    except (ValueError, TypeError) as error:
        raise ConfigError(str(error).splitlines()[0]) from None


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


def _validate_evaluate_clients(section: DictConfig) -> None:
    """The rules of :class:`~fedsim.client.evaluation.ClientEvaluation`, checked before the data is loaded."""
    from fedsim.client.evaluation import ClientEvaluation

    try:
        ClientEvaluation(section.who, section.size, section.every)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _validate_compression(section: DictConfig) -> None:
    """``error_feedback`` a boolean (the command line reads ``compression.error_feedback=no`` as the string "no",
    which ``bool()`` makes true); codecs given by ``_target_`` importable and given only the keys they take. The
    codecs' own arguments are checked when they are built (fedsim/comm), naming their list entry."""
    if not isinstance(section, DictConfig):
        return
    flag = section.get("error_feedback", False)
    _require(isinstance(flag, bool), "compression.error_feedback", "must be true or false", flag)
    for direction in ("uplink", "downlink"):
        entries = section.get(direction)
        for i, entry in enumerate(entries if OmegaConf.is_list(entries) else []):
            if isinstance(entry, DictConfig) and "_target_" in entry:
                check_section(entry, f"compression.{direction}[{i}]", ConfigError)


TRACKER_TEXT = {  # the trackers' text settings (fedsim/observe/trackers.py): whether null is allowed
    "tracking_uri": True,
    "experiment": False,
    "run_name": True,
    "project": False,
    "mode": False,
    "dir": True,
    "entity": True,
}
TRACKER_NAMES = ("experiment", "run_name", "project", "entity")  # names, which may be made of digits


def _validate_tracker(section: DictConfig) -> None:
    """The trackers' settings take text: a name, a URI, a folder, a mode. A number or a list there is a mistake
    (quote a name made of digits); ``settings`` is a mapping of wandb.Settings fields. What the text means (a URI
    that answers, a mode wandb knows) is checked when the tracker starts, before training."""
    if not isinstance(section, DictConfig) or section.get("_target_") is None:
        return
    for key, nullable in TRACKER_TEXT.items():
        if key not in section:
            continue
        value = section.get(key)
        quote = key in TRACKER_NAMES and isinstance(value, (int, float)) and not isinstance(value, bool)
        _require(
            (isinstance(value, str) and value != "") or (nullable and value is None),
            f"tracker.{key}",
            f"must be a non-empty string{' or null' if nullable else ''}",
            value,
            f"quote a name made of digits: tracker.{key}=\"'{value}'\"" if quote else "",
        )
    settings = section.get("settings")
    _require(
        settings is None or isinstance(settings, Mapping),
        "tracker.settings",
        "must be a mapping of wandb.Settings fields, e.g. {console: 'off'}",
        settings,
    )


def to_yaml(cfg: DictConfig) -> str:
    """The resolved configuration as YAML text (for logs and TensorBoard)."""
    return OmegaConf.to_yaml(cfg, resolve=True)


def _validate_round(node: DictConfig) -> None:
    """Each ``round.extra`` entry is a ``{_target_: ...}`` mapping (its class checks the rest when it is built)."""
    for i, entry in enumerate(node.extra or []):
        if not OmegaConf.is_dict(entry) or not isinstance(entry.get("_target_"), str):
            raise ConfigError(
                f"round.extra[{i}] must be a stage entry {{_target_: your_module.YourStage, ...}} (got {entry!r}); "
                "docs/writing-a-round-step.md"
            )
