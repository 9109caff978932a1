"""Distributed differential privacy under secure aggregation: each client adds integer noise to its rounded vector
before the reduction mod 2^b and the masks, so that the sum the server decodes is private without any party
adding noise to it (docs/secure-aggregation.md, "Distributed differential privacy").

``mechanism="ddg"``: the distributed discrete Gaussian (Kairouz, Liu, Steinke, ICML 2021), ``"skellam"``: the
distributed Skellam mechanism (Agarwal, Kairouz, Liu, NeurIPS 2021). In a round with cohort n (who started it),
K the clients the round plans to aggregate (``clients_per_round``; the cohort when unknown) and the clip c:

* **noise multiplier** z (``noise_multiplier``, or solved from ``epsilon``): the noise of K clients has standard
  deviation z·c in the units of the updates, as central DP's z·C: each client adds noise of standard deviation
  σ = z·ℓ/√K in integer units, ℓ = s·c the clip in those units (the scale s as in :mod:`fedsim.secagg.quantize`);
* **the default scale** keeps room for n inputs of at most ℓ and :data:`NOISE_SIGMAS` standard deviations of the
  noise of up to n clients: ℓ = ⌊(2^(b−1) − 2)/(n + k·z·√(n/K))⌋, k = :data:`NOISE_SIGMAS`;
* **conditional randomized rounding** (``beta``): a client re-rounds until ‖q‖₂ ≤ Δ₂ (:mod:`fedsim.secagg.accounting`);
* **accounting**: the round's Rényi curve with the m clients whose noise is in the sum (the survivors), added to the
  run's; ε at ``delta`` after every round. Without amplification by sampling (see the docs: valid for any sampling).
* **budget**: after a round, when one more round like it with K survivors would bring ε above ``epsilon_max``, the
  run stops there (``stop_reason``); when fewer clients than planned survived and ε already exceeds it, it stops too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np
import torch

from fedsim.privacy.accountant import accounting_library
from fedsim.secagg.accounting import (
    ORDERS,
    ddg_rdp,
    ddg_tau,
    rdp_epsilon,
    rounded_l1_bound,
    rounded_l2_bound,
    skellam_rdp,
)
from fedsim.secagg.noise import discrete_gaussian, noise_generator, skellam

MECHANISMS = ("none", "ddg", "skellam")
NOISE_SIGMAS = 6.0
"""k: standard deviations of the summed noise the default scale keeps free (|N(0,1)| > 6: about 2e-9 per coordinate)."""
DEFAULT_BETA = math.exp(-0.5)
"""β of conditional rounding: e^(−1/2), TensorFlow Federated's and the distributed-DP authors' default."""


def _positive(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(float(value)) and float(value) > 0


def _check(name: str, ok: bool, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"secagg.dp.{name} must be {rule} (got {value!r})")


@dataclass(frozen=True)
class RoundNoise:
    """One round's noise: the ``mechanism``, multiplier ``z``, clip ``levels`` ℓ, coordinates ``dim`` d', each
    client's standard deviation ``sigma`` σ (integer units) and ``beta``."""

    mechanism: str
    z: float
    levels: float
    dim: int
    sigma: float
    beta: float

    @property
    def l2(self) -> float:
        """Δ₂ after conditional rounding: what each client's ‖q‖₂ is kept within."""
        return rounded_l2_bound(self.levels, self.dim, self.beta)

    @property
    def l1(self) -> float:
        """Δ₁ of the rounded vector."""
        return rounded_l1_bound(self.l2, self.dim)

    def sample(self, seed: int, round_num: int, client_id: int) -> torch.Tensor:
        """``client_id``'s noise (int64, d' coordinates) from its own stream."""
        generator = noise_generator(seed, round_num, client_id)
        draw = discrete_gaussian if self.mechanism == "ddg" else lambda g, s, n: skellam(g, s * s, n)
        return torch.from_numpy(draw(generator, self.sigma, self.dim))

    def rdp(self, clients: int) -> np.ndarray:
        """The Rényi curve of the sum with ``clients`` clients' noise in it (none: infinite)."""
        if clients == 0:
            return np.zeros(len(ORDERS))  # nothing released
        if self.mechanism == "ddg":
            return ddg_rdp(self.l2, self.l1, self.sigma, clients, self.dim)
        return skellam_rdp(self.l2, self.l1, clients * self.sigma**2)

    def metrics(self, clients: int) -> dict[str, float]:
        """The derived parameters, logged as ``secagg/dp/...``."""
        out = {"dp/noise_multiplier": self.z, "dp/local_std": self.sigma}
        out |= {"dp/l2_sensitivity": self.l2, "dp/l1_sensitivity": self.l1, "dp/beta": self.beta}
        out["dp/noise_clients"] = float(clients)
        if self.mechanism == "ddg":
            out["dp/tau"] = ddg_tau(self.sigma, clients)
        else:
            out["dp/poisson_mean"] = self.sigma**2 / 2
        return out


class DistributedDP:
    """The settings and the privacy ledger of distributed DP (module docstring); ``mechanism="none"``: off. Give
    ``noise_multiplier`` z or a target ``epsilon`` for ``rounds`` rounds (z is then solved when the model's size is
    known, :meth:`solve`); ε is reported at ``delta``; ``epsilon_max`` stops the run before it is exceeded."""

    def __init__(
        self,
        *,
        mechanism: str = "none",
        noise_multiplier: float | None = None,
        epsilon: float | None = None,
        delta: float = 1e-5,
        epsilon_max: float | None = None,
        beta: float = DEFAULT_BETA,
    ) -> None:
        _check("mechanism", mechanism in MECHANISMS, f"one of {', '.join(MECHANISMS)}", mechanism)
        _check(
            "noise_multiplier", noise_multiplier is None or _positive(noise_multiplier), "> 0 or null", noise_multiplier
        )
        _check("epsilon", epsilon is None or _positive(epsilon), "> 0 or null", epsilon)
        _check("delta", _positive(delta) and delta < 1, "in (0, 1)", delta)
        _check("epsilon_max", epsilon_max is None or _positive(epsilon_max), "> 0 or null", epsilon_max)
        _check("beta", isinstance(beta, Real) and not isinstance(beta, bool) and 0 <= beta < 1, "in [0, 1)", beta)
        on = mechanism != "none"
        if on and (noise_multiplier is None) == (epsilon is None):
            raise ValueError(
                f"secagg.dp.mechanism={mechanism} needs exactly one of secagg.dp.noise_multiplier and "
                f"secagg.dp.epsilon (got {noise_multiplier!r} and {epsilon!r})"
            )
        if on:
            accounting_library()  # the ledger converts with it: without it, stop now in one line
        self.mechanism, self.target, self.delta, self.epsilon_max = mechanism, epsilon, float(delta), epsilon_max
        self.beta = float(beta)
        self.z = None if noise_multiplier is None else float(noise_multiplier)
        self.rdp, self.rounds = np.zeros(len(ORDERS)), 0

    @property
    def on(self) -> bool:
        """Whether the clients add noise."""
        return self.mechanism != "none"

    def levels(self, bits: int, cohort: int, planned: int, z: float) -> int:
        """The default scale's ℓ: room for ``cohort`` inputs and k standard deviations of their noise (docstring)."""
        room = cohort + NOISE_SIGMAS * z * math.sqrt(cohort / planned)
        return max(0, math.floor((2 ** (bits - 1) - 2) / room))

    def noise(self, z: float, levels: float, dim: int, planned: int) -> RoundNoise:
        """A round's :class:`RoundNoise` for clip ``levels`` ℓ, ``dim`` coordinates and K = ``planned``."""
        return RoundNoise(self.mechanism, z, float(levels), dim, z * levels / math.sqrt(planned), self.beta)

    def solve(self, levels_of: Callable[[float], float], dim: int, planned: int, rounds: int) -> float:
        """z: the given noise multiplier, or the smallest on a geometric grid (ratio 1.25, then bisected to a
        relative 1e-9) whose ``rounds`` rounds of K = ``planned`` clients' noise, with clip levels ``levels_of(z)``
        and ``dim`` coordinates, stay within the target ε; refused in one line when none does."""
        if self.z is not None:
            return self.z
        assert self.target is not None  # __init__ asks for one of the two

        def spent(z: float) -> float:
            levels = levels_of(z)
            return (
                math.inf
                if levels < 1
                else rdp_epsilon(rounds * self.noise(z, levels, dim, planned).rdp(planned), self.delta)
            )

        grid = [1e-3 * 1.25**i for i in range(int(math.log(1e6) / math.log(1.25)) + 2)]
        reached = next((i for i, z in enumerate(grid) if spent(z) <= self.target), None)
        if reached is None:
            raise ValueError(
                f"secagg.dp.epsilon={self.target} cannot be reached in {rounds} rounds of {planned} clients with "
                f"{dim} coordinates at this secagg.bits (the noise it needs leaves no room in the group); raise "
                "secagg.bits or the target, or set secagg.dp.noise_multiplier"
            )
        low, high = (grid[reached - 1] if reached else grid[0] / 1.25), grid[reached]
        while high - low > 1e-9 * high:
            middle = (low + high) / 2
            low, high = (low, middle) if spent(middle) <= self.target else (middle, high)
        self.z = high
        return high

    def check_first(self, noise: RoundNoise, planned: int) -> None:
        """Refuse, in one line, an ``epsilon_max`` that one round of ``planned`` clients' noise already exceeds."""
        first = rdp_epsilon(noise.rdp(planned), self.delta)
        if self.epsilon_max is not None and first > self.epsilon_max:
            raise ValueError(
                f"secagg.dp.epsilon_max={self.epsilon_max} is below ε={first:.4g} of a single round "
                f"(secagg.dp.mechanism={self.mechanism}, z={noise.z:.4g}, δ={self.delta}); raise it, or the noise"
            )

    def stop_reason(self, round_num: int, noise: RoundNoise, planned: int) -> str | None:
        """Why the run must stop after round ``round_num``: ε already above ``epsilon_max`` (fewer clients than
        planned added noise), or one more round like this one with ``planned`` clients would exceed it; else None."""
        if self.epsilon_max is None:
            return None
        now = self.epsilon()
        if now > self.epsilon_max:
            return (
                f"privacy budget: ε={now:.4g} after round {round_num} exceeds secagg.dp.epsilon_max="
                f"{self.epsilon_max}: fewer than the {planned} clients planned added noise (δ={self.delta})"
            )
        after = self.epsilon(noise.rdp(planned))
        if after <= self.epsilon_max:
            return None
        return (
            f"privacy budget: round {round_num + 1} would bring ε to {after:.4g} > secagg.dp.epsilon_max="
            f"{self.epsilon_max} (ε={now:.4g} after {self.rounds} rounds, δ={self.delta})"
        )

    def epsilon(self, extra: np.ndarray | None = None) -> float:
        """ε at ``delta`` of the rounds recorded (and of ``extra``, a round not yet run)."""
        return rdp_epsilon(self.rdp if extra is None else self.rdp + extra, self.delta)

    def record(self, noise: RoundNoise, clients: int) -> float:
        """Add a round whose sum holds ``clients`` clients' noise; ε after it."""
        self.rdp, self.rounds = self.rdp + noise.rdp(clients), self.rounds + 1
        return self.epsilon()

    def state_dict(self) -> dict[str, Any]:
        """The ledger (the summed Rényi curve, as plain floats) and the noise multiplier."""
        return {"rdp": [float(r) for r in self.rdp], "rounds": self.rounds, "z": self.z}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put the ledger back (a resume)."""
        self.rdp, self.rounds = np.asarray(state["rdp"], dtype=np.float64), int(state["rounds"])
        self.z = None if state["z"] is None else float(state["z"])
