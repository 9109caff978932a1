"""A user's own strategies, kept outside the fedsim package and plugged in by ``_target_``.

Put this folder on ``PYTHONPATH`` and select a class from the command line (from the repository root)::

    PYTHONPATH=experiments/custom_strategy python -m fedsim \
        strategy._target_=my_strategies.ClippedFedAvg +strategy.max_norm=1.0

* :class:`ClippedFedAvg` is a server-side rule only: it clips each client's change (client − global)
  to an L2 norm of at most ``max_norm`` before the example-weighted average. It runs in the main
  process.
* :class:`AdaptiveClippedFedAvg` is the same rule with a bound that follows a quantile of the clients'
  update norms (Andrew, Thakkar, McMahan, Ramaswamy, "Differentially Private Learning with Adaptive
  Clipping", NeurIPS 2021, without the noise): a stateful rule with ``state_dict``/``load_state_dict``.
* :class:`L1FedAvg` adds a client half, :class:`L1TowardsGlobal`, which adds λ‖w − w_global‖₁ to
  every batch loss (the L1 sibling of FedProx's proximal term, for illustration; not from a paper).
  The client half is pickled to every worker process, so this module must be importable there too:
  spawned workers find it through ``PYTHONPATH``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fedsim.strategy import LocalTraining, Strategy
from fedsim.strategy.functional import weighted_average
from fedsim.types import ClientUpdate


def clip_delta(params: torch.Tensor, global_params: torch.Tensor, max_norm: float) -> torch.Tensor:
    """global + (params − global)·min(1, max_norm / ‖params − global‖₂), computed in float64."""
    anchor = global_params.to(torch.float64)
    delta = params.to(torch.float64) - anchor
    norm = float(delta.norm())
    scale = 1.0 if norm <= max_norm else max_norm / norm
    return anchor + scale * delta


class ClippedFedAvg(Strategy):
    """FedAvg over client changes clipped to L2 norm ``max_norm``: the global model moves at most
    ``max_norm`` per round. Like FedAvg, it drops simulated stragglers."""

    keeps_stragglers = False

    def __init__(self, max_norm: float = 1.0) -> None:
        if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not max_norm > 0:
            raise ValueError(f"strategy.max_norm must be a number > 0 (got {max_norm!r})")
        self.max_norm = float(max_norm)

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        clipped = [clip_delta(u.params, global_params, self.max_norm) for u in updates]
        mean = weighted_average(clipped, [u.num_examples for u in updates])
        return mean.to(global_params.dtype)


class AdaptiveClippedFedAvg(Strategy):
    """ClippedFedAvg whose bound C tracks the ``quantile`` of the update norms (Andrew et al. 2021):
    after each round C ← C·exp(−norm_lr·(b − quantile)), b = share of this round's updates with norm ≤ C.
    """

    keeps_stragglers = False

    def __init__(self, *, quantile: float = 0.5, norm_lr: float = 0.2, initial_norm: float = 0.1) -> None:
        if not 0 < quantile < 1 or not norm_lr > 0 or not initial_norm > 0:
            raise ValueError(
                "strategy.quantile must be in (0, 1), strategy.norm_lr and strategy.initial_norm > 0 "
                f"(got {quantile!r}, {norm_lr!r}, {initial_norm!r})"
            )
        self.quantile, self.norm_lr = float(quantile), float(norm_lr)
        self.max_norm = float(initial_norm)

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        clipped = [clip_delta(u.params, global_params, self.max_norm) for u in updates]
        norms = [float((u.params.to(torch.float64) - global_params.to(torch.float64)).norm()) for u in updates]
        below = sum(n <= self.max_norm for n in norms) / len(norms)
        self.max_norm *= math.exp(-self.norm_lr * (below - self.quantile))
        return weighted_average(clipped, [u.num_examples for u in updates]).to(global_params.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"max_norm": self.max_norm}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.max_norm = float(state["max_norm"])


class L1TowardsGlobal(LocalTraining):
    """Client half: remembers the global weights when a task starts and adds λ‖w − w_global‖₁."""

    def __init__(self) -> None:
        self.lam = 0.0
        self.anchor: list[torch.Tensor] = []

    def begin(self, model: nn.Module, config: dict[str, Any]) -> None:
        self.lam = float(config.get("l1_lambda", 0.0))
        self.anchor = [p.detach().clone() for p in model.parameters()]

    def loss_term(self, model: nn.Module) -> torch.Tensor | None:
        if self.lam == 0.0:
            return None
        distance = sum((p - a).abs().sum() for p, a in zip(model.parameters(), self.anchor, strict=True))
        return self.lam * distance  # type: ignore[return-value]

    def functional_term(
        self, params: dict[str, torch.Tensor], anchor: dict[str, torch.Tensor], numbers: dict[str, torch.Tensor]
    ) -> torch.Tensor | None:
        """The same term as a pure function, so that ``executor=vmap`` can run this client half too."""
        if "l1_lambda" not in numbers:
            return None
        return numbers["l1_lambda"] * sum((p - anchor[name]).abs().sum() for name, p in params.items())  # type: ignore[return-value]


class L1FedAvg(Strategy):
    """Server half: FedAvg aggregation; tells every client its λ (``lam``) through ``client_config``."""

    keeps_stragglers = False

    def __init__(self, lam: float = 0.01) -> None:
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or lam < 0:
            raise ValueError(f"strategy.lam must be a number >= 0 (got {lam!r})")
        self.lam = float(lam)

    def local_training(self) -> LocalTraining:
        return L1TowardsGlobal()

    def client_config(self, round_num: int, client_id: int) -> dict[str, Any]:
        return {"l1_lambda": self.lam}

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        return weighted_average([u.params for u in updates], [u.num_examples for u in updates])
