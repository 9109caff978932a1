"""Server optimizers: FedAvgM, FedAdagrad, FedAdam and FedYogi, one class :class:`FedOpt`.

Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan. "Adaptive Federated Optimization."
ICLR 2021 (FedAdagrad, FedAdam, FedYogi; Algorithm 2).
Hsu, Qi, Brown. "Measuring the Effects of Non-Identical Data Distribution for Federated Visual
Classification." arXiv:1909.06335, 2019 (FedAvgM).

Each round the server forms Δ = (example-weighted mean of the clients' weights) − (global weights), the
average client *change* (Reddi's Δₜ; ``-Δ`` is the pseudo-gradient), and takes one optimizer step
x ← x + η·direction. The arithmetic runs in float64 and the state (m, v) is kept in float64; the new
weights come back in the dtype of the global weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fedsim.core.checks import number, within
from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import Strategy
from fedsim.strategy.functional import weighted_average

OPTIMIZERS = ("sgdm", "adam", "yogi", "adagrad")


def _require(ok: bool, name: str, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"strategy.{name} {rule} (got {value!r})")


def second_moment(optimizer: str, v: torch.Tensor, delta: torch.Tensor, beta2: float) -> torch.Tensor:
    """vₜ from vₜ₋₁ (updated in place) and Δₜ, by Reddi et al.'s rule for ``adagrad``, ``adam`` or ``yogi``."""
    square = delta.square()
    if optimizer == "adagrad":
        return v.add_(square)  # v + Δ²
    if optimizer == "adam":
        return v.mul_(beta2).add_(square, alpha=1 - beta2)  # β₂v + (1−β₂)Δ²
    return v.sub_((v - square).sign_().mul_(square), alpha=1 - beta2)  # v − (1−β₂)Δ² sign(v − Δ²)


class FedOpt(Strategy):
    """One server optimizer step per round on Δ = aggregate − global.

    ``optimizer``:

    * ``"sgdm"`` (FedAvgM, Hsu et al.): m ← β₁m + Δ (undamped momentum); x ← x + η·m.
      With ``momentum=0`` and ``server_lr=1`` this is FedAvg.
    * ``"adagrad"`` / ``"adam"`` / ``"yogi"`` (Reddi et al.): m ← β₁m + (1−β₁)Δ;
      v ← v + Δ² (adagrad), β₂v + (1−β₂)Δ² (adam), v − (1−β₂)Δ² sign(v − Δ²) (yogi);
      x ← x + η·m / (√v + τ). ``beta2`` is unused by adagrad.

    ``bias_correction=False`` (default) is the paper's rule: no bias correction, v starts at
    ``initial_accumulator`` = τ² (Reddi et al., Algorithm 2, v₋₁ ≥ τ²). ``bias_correction=True`` is
    the ``torch.optim.Adam`` convention: m̂ = m/(1−β₁ᵗ), and for adam/yogi v̂ = v/(1−β₂ᵗ) (adagrad's v is
    a sum and is not corrected); there ``initial_accumulator`` defaults to 0, as in torch. It does not
    apply to sgdm. Pass ``initial_accumulator`` to choose v's start value yourself.
    """

    needs = frozenset()  # a function of the mean update alone (runs under central DP and secure aggregation)

    def __init__(
        self,
        *,
        optimizer: str,
        server_lr: float,
        momentum: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        bias_correction: bool = False,
        initial_accumulator: float | None = None,
    ) -> None:
        _require(optimizer in OPTIMIZERS, "optimizer", f"must be one of {', '.join(OPTIMIZERS)}", optimizer)
        number("strategy.server_lr", server_lr, above=0)
        within("strategy.momentum", momentum, "[0, 1)")
        within("strategy.beta2", beta2, "[0, 1)")
        number("strategy.tau", tau, above=0)
        _require(isinstance(bias_correction, bool), "bias_correction", "must be true or false", bias_correction)
        _require(
            not (bias_correction and optimizer == "sgdm"),
            "bias_correction",
            "applies to adam, yogi and adagrad, not sgdm (FedAvgM's momentum is undamped)",
            bias_correction,
        )
        if initial_accumulator is None:
            initial_accumulator = 0.0 if bias_correction else tau * tau
        number("strategy.initial_accumulator", initial_accumulator, at_least=0)
        self.optimizer, self.server_lr, self.momentum, self.beta2, self.tau = optimizer, server_lr, momentum, beta2, tau
        self.bias_correction, self.initial_accumulator = bias_correction, initial_accumulator
        self.step = 0
        self.m: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        average = weighted_average([u.params for u in updates], [u.num_examples for u in updates])
        x = global_params.to(torch.float64)
        delta = average.to(torch.float64) - x
        return (x + self.server_lr * self._direction(delta)).to(global_params.dtype)

    def _direction(self, delta: torch.Tensor) -> torch.Tensor:
        """Update m (and v) with Δ and return the step direction (η not applied)."""
        if self.m is None:
            self.m = torch.zeros_like(delta)
            if self.optimizer != "sgdm":
                self.v = torch.full_like(delta, float(self.initial_accumulator))
        if self.m.shape != delta.shape:
            raise ValueError(f"server optimizer state has shape {tuple(self.m.shape)}, the model {tuple(delta.shape)}")
        self.step += 1
        if self.optimizer == "sgdm":
            return self.m.mul_(self.momentum).add_(delta)
        assert self.v is not None
        self.m.mul_(self.momentum).add_(delta, alpha=1 - self.momentum)
        self.v = second_moment(self.optimizer, self.v, delta, self.beta2)
        m, v = self.m, self.v
        if self.bias_correction:
            m = m / (1 - self.momentum**self.step)
            if self.optimizer != "adagrad":
                v = v / (1 - self.beta2**self.step)
        return m / (v.sqrt() + self.tau)

    def state_dict(self) -> dict[str, Any]:
        """``{"step": int, "m": tensor | None, "v": tensor | None}`` (copies; None before the first round)."""
        return {"step": self.step, "m": _copy(self.m), "v": _copy(self.v)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.m = _copy(state["m"], torch.float64)
        self.v = _copy(state["v"], torch.float64)


def _copy(tensor: torch.Tensor | None, dtype: torch.dtype | None = None) -> torch.Tensor | None:
    return None if tensor is None else tensor.detach().to(dtype=dtype or tensor.dtype, copy=True)


# Config-facing constructors: each fixes ``optimizer`` and drops the parameters it does not use.


def FedAvgM(*, server_lr: float = 1.0, momentum: float = 0.9) -> FedOpt:  # noqa: N802
    """FedAvg with server momentum (Hsu et al. 2019): ``FedOpt(optimizer="sgdm", ...)``."""
    return FedOpt(optimizer="sgdm", server_lr=server_lr, momentum=momentum)


def FedAdagrad(
    *,
    server_lr: float = 0.01,
    momentum: float = 0.9,
    tau: float = 1e-3,
    bias_correction: bool = False,
    initial_accumulator: float | None = None,
) -> FedOpt:  # noqa: N802
    """FedAdagrad (Reddi et al. 2021): ``FedOpt(optimizer="adagrad", ...)``."""
    return FedOpt(
        optimizer="adagrad",
        server_lr=server_lr,
        momentum=momentum,
        tau=tau,
        bias_correction=bias_correction,
        initial_accumulator=initial_accumulator,
    )


def FedAdam(
    *,
    server_lr: float = 0.01,
    momentum: float = 0.9,
    beta2: float = 0.99,
    tau: float = 1e-3,
    bias_correction: bool = False,
    initial_accumulator: float | None = None,
) -> FedOpt:  # noqa: N802
    """FedAdam (Reddi et al. 2021): ``FedOpt(optimizer="adam", ...)``."""
    return FedOpt(
        optimizer="adam",
        server_lr=server_lr,
        momentum=momentum,
        beta2=beta2,
        tau=tau,
        bias_correction=bias_correction,
        initial_accumulator=initial_accumulator,
    )


def FedYogi(
    *,
    server_lr: float = 0.01,
    momentum: float = 0.9,
    beta2: float = 0.99,
    tau: float = 1e-3,
    bias_correction: bool = False,
    initial_accumulator: float | None = None,
) -> FedOpt:  # noqa: N802
    """FedYogi (Reddi et al. 2021): ``FedOpt(optimizer="yogi", ...)``."""
    return FedOpt(
        optimizer="yogi",
        server_lr=server_lr,
        momentum=momentum,
        beta2=beta2,
        tau=tau,
        bias_correction=bias_correction,
        initial_accumulator=initial_accumulator,
    )
