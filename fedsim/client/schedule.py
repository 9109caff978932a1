"""The client learning rate of every round: :class:`LrSchedule`, a pure function of the round number.

A client's ``lr_schedule`` (``client.lr_schedule`` in the configuration) scales the learning rate its tasks train
with, round by round. The server computes round r's rate (:func:`scheduled_config`) and sends it in the task's
config as ``lr``, which :meth:`fedsim.client.base.Client.make_optimizer` (and every executor, ``executor=vmap``
included) applies; the update reports it back (``update.metrics["lr"]``, read by SCAFFOLD and q-FFL). Nothing is
stored: a resumed run computes the same rates from the round numbers. With η the base rate (the round config's
``lr`` if the strategy sets one, else the client optimizer's) and t = r − 1 (rounds count from 1):

    constant     η_r = η
    exponential  η_r = η · γ^t
    step         η_r = η · γ^⌊t / s⌋                                   (s: ``step_rounds``)
    cosine       η_r = η_min + (η − η_min) · (1 + cos(π · min(t, T) / T)) / 2   (T: ``num_rounds``)

These are PyTorch's ``ExponentialLR``, ``StepLR`` and ``CosineAnnealingLR`` (``T_max`` = T, ``eta_min`` = η_min)
stepped once per round and read before round r's training, written in closed form; cosine stays at η_min after T
rounds (a run extended past them) instead of rising again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

KINDS = ("constant", "exponential", "step", "cosine")


@dataclass(frozen=True)
class LrSchedule:
    """How the learning rate moves from round to round (see the module docstring for the formulas).

    ``gamma``: the factor of ``exponential`` and ``step``; ``step_rounds``: the rounds between two of ``step``'s
    decays; ``min_lr`` and ``num_rounds``: where ``cosine`` ends and after how many rounds (``None``: the run's
    ``num_rounds``, which the server fills in)."""

    kind: str = "constant"
    gamma: float = 0.99
    step_rounds: int = 10
    min_lr: float = 0.0
    num_rounds: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"client.lr_schedule.kind must be one of {', '.join(KINDS)} (got {self.kind!r})")
        if not (0 < self.gamma <= 1):
            raise ValueError(
                f"client.lr_schedule.gamma must be in (0, 1] (got {self.gamma}): the factor the rate is multiplied by"
            )
        if self.step_rounds < 1:
            raise ValueError(f"client.lr_schedule.step_rounds must be >= 1 (got {self.step_rounds})")
        if not (self.min_lr >= 0 and math.isfinite(self.min_lr)):
            raise ValueError(f"client.lr_schedule.min_lr must be a finite number >= 0 (got {self.min_lr})")
        if self.num_rounds is not None and self.num_rounds < 1:
            raise ValueError(
                f"client.lr_schedule.num_rounds must be >= 1 or null (got {self.num_rounds}); "
                "null: the run's num_rounds"
            )

    @property
    def constant(self) -> bool:
        """Whether every round trains with the base rate (the task config then carries no ``lr`` of its own)."""
        return self.kind == "constant"

    def lr(self, base: float, round_num: int, num_rounds: int | None = None) -> float:
        """η_r for round ``round_num`` (from 1) from the base rate η; ``num_rounds`` is T when the schedule has none.
        Computed in Python floats, so every process gets the same bits."""
        t = max(round_num - 1, 0)
        if self.kind == "exponential":
            return base * self.gamma**t
        if self.kind == "step":
            return base * self.gamma ** (t // self.step_rounds)
        if self.kind == "cosine":
            total = self.num_rounds or num_rounds
            if total is None:
                raise ValueError("client.lr_schedule.kind=cosine needs num_rounds (the rounds it spans)")
            return self.min_lr + (base - self.min_lr) * (1 + math.cos(math.pi * min(t, total) / total)) / 2
        return base


def base_lr(client: Any, config: dict[str, Any]) -> float:
    """The rate a schedule scales: the round config's ``lr`` (a strategy's, e.g. Per-FedAvg's β) if it has one, else
    the learning rate the client's optimizer factory gives (read from an optimizer built over one scalar)."""
    if "lr" in config:
        return float(config["lr"])
    probe = client.optimizer([torch.zeros(1, requires_grad=True)])
    return float(probe.param_groups[0]["lr"])


def scheduled_config(client: Any, config: dict[str, Any], round_num: int, num_rounds: int) -> dict[str, Any]:
    """``config`` with round ``round_num``'s learning rate as ``lr`` when ``client`` has a schedule that is not
    constant; ``config`` itself otherwise (a client without ``lr_schedule``, e.g. an adapter, has none)."""
    schedule = getattr(client, "lr_schedule", None)
    if schedule is None or schedule.constant:
        return config
    return {**config, "lr": schedule.lr(base_lr(client, config), round_num, num_rounds)}
