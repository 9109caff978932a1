"""``secagg=...``: the secure-aggregation stage a run's config asks for (:mod:`fedsim.secagg`), built for
:mod:`fedsim.cli.run`, which puts it ahead of the stages of ``round.extra``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from omegaconf import DictConfig

from fedsim.core.errors import ConfigError
from fedsim.privacy.rounds import check_delta
from fedsim.secagg import SecureAggregation
from fedsim.server.stage import RoundStage
from fedsim.sim.clock import SyncClock
from fedsim.strategy.base import Strategy


def clash(cfg: DictConfig, strategy: Strategy) -> str | None:
    """What of the run secure aggregation cannot run with, and what to do, or ``None``."""
    if cfg.dp.get("_target_") is not None:
        return "dp=central noises the individual updates, which secure aggregation hides from the server; use dp=none"
    if cfg.compression.get("uplink") or cfg.compression.get("error_feedback"):
        return "the clients upload masked integers, not the uplink codecs' encoding; use compression=none"
    if getattr(strategy, "asynchronous", False):
        return (
            f"{type(strategy).__name__} is asynchronous, and secure aggregation sums a synchronous round's cohort; "
            "use a synchronous strategy"
        )
    return None


def build_secagg(
    cfg: DictConfig,
    strategy: Strategy,
    instantiate: Callable[[DictConfig], Any],
    clock: SyncClock | None = None,
    num_clients: int | None = None,
) -> list[RoundStage]:
    """The stage of ``cfg.secagg`` (none with ``secagg=none``), given the run's seed, ``clients_per_round``,
    ``num_rounds`` and simulated ``clock``; a combination it cannot run is refused in one line, and so is a
    distributed-DP ``delta`` of at least 1/``num_clients``."""
    if cfg.secagg.get("_target_") is None:
        return []
    problem = clash(cfg, strategy)
    if problem is not None:
        raise ConfigError(f"secagg={cfg.secagg.get('protocol')}: {problem} (docs/secure-aggregation.md)")
    if cfg.secagg.get("_partial_") is not True:
        raise ConfigError(
            "secagg: the option needs `_partial_: true` (fedsim passes seed, clients_per_round, num_rounds, clock)"
        )
    stage = instantiate(cfg.secagg)(
        seed=cfg.seed, clients_per_round=cfg.clients_per_round, num_rounds=cfg.num_rounds, clock=clock
    )
    if not isinstance(stage, RoundStage):
        raise ConfigError(f"secagg._target_={cfg.secagg._target_} builds a {type(stage).__name__}, not a RoundStage")
    if isinstance(stage, SecureAggregation) and stage.dp.on and num_clients is not None:
        check_delta(stage.dp.delta, num_clients, key="secagg.dp.delta")
    return [stage]


def prepare_secagg(stages: Sequence[RoundStage], size: int) -> None:
    """Distributed DP's noise multiplier solved and its budget checked for a model of ``size`` weights, before the
    first round (one line when the target ε cannot be reached or one round exceeds ``epsilon_max``)."""
    for stage in stages:
        if isinstance(stage, SecureAggregation):
            stage.prepare(size)
