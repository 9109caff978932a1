"""Central differential privacy: DP-FedAvg with fixed or adaptive clipping.

McMahan, Ramage, Talwar, Zhang. "Learning Differentially Private Recurrent Language Models." ICLR 2018 (DP-FedAvg).
Andrew, Thakkar, McMahan, Ramaswamy. "Differentially Private Learning with Adaptive Clipping." NeurIPS 2021.

Each round, with clip norm C and noise multiplier z, the server (trusted, as in the paper) clips every client's
update Δᵢ = wᵢ − w (as it decoded it) to L2 norm at most C, sums the clipped updates, adds Gaussian noise
N(0, (z·C)²·I) once, and divides by the *expected* cohort size m = q·N (the paper's fixed-denominator estimator
with every client weighing 1: example weighting would raise the sensitivity). The noisy mean update then goes to the
strategy as if it were one client's (FedAvg adds it; FedAdam and the other server optimizers take their step with
it). Noise comes from a generator seeded by (seed, round): the same whatever the executor or the workers.

Adaptive clipping (Andrew et al., Algorithm 1 with the geometric update): each client also contributes
bᵢ = 1[‖Δᵢ‖ ≤ C] − ½; the server estimates the unclipped fraction b̃ = (Σ bᵢ + N(0, σ_b²)) / m + ½ and sets
C ← C·exp(−η_C (b̃ − γ)) for the next round, γ the target quantile. The update's noise multiplier becomes
z_Δ = (z⁻² − (2σ_b)⁻²)^(-1/2), so that the two releases together are one Gaussian mechanism with multiplier z, which
is what the accountant charges (the paper's Theorem 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from fedsim.core.checks import is_number, number, within
from fedsim.core.seeding import dp_seed
from fedsim.privacy.accountant import accounting_library, check_accountant


class CentralDP:
    """DP-FedAvg's server side for a run of ``num_clients`` clients with ``clients_per_round`` expected per round."""

    def __init__(
        self,
        *,
        noise_multiplier: float,
        clip_norm: float,
        delta: float = 1e-5,
        epsilon_max: float | None = None,
        adaptive: bool = False,
        target_quantile: float = 0.5,
        clip_lr: float = 0.2,
        count_noise: float | None = None,
        accountant: str = "rdp",
    ) -> None:
        """``accountant`` converts the rounds to ε (and so drives ``epsilon_max``): ``"rdp"`` or ``"pld"``
        (:mod:`fedsim.privacy.accountant`)."""
        self.accountant = check_accountant(accountant)
        number("dp.noise_multiplier", noise_multiplier, above=0)
        number("dp.clip_norm", clip_norm, above=0)
        within("dp.delta", delta, "(0, 1)", hint="; keep it far below 1 / the number of clients")
        if epsilon_max is not None and not epsilon_max > 0:
            raise ValueError(f"dp.epsilon_max must be > 0 or null (got {epsilon_max})")
        if not isinstance(adaptive, bool):
            raise ValueError(f"dp.adaptive must be true or false (got {adaptive!r})")
        within("dp.target_quantile", target_quantile, "[0, 1]")
        number("dp.clip_lr", clip_lr, above=0, hint="; the step η_C of adaptive clipping's update, e.g. 0.2")
        if count_noise is not None and not (is_number(count_noise) and count_noise > 0):
            raise ValueError(
                f"dp.count_noise must be a finite number > 0 or null (got {count_noise!r}); "
                "it must exceed noise_multiplier / 2"
            )
        self.noise_multiplier, self.clip_norm, self.delta, self.epsilon_max = (
            noise_multiplier,
            clip_norm,
            delta,
            epsilon_max,
        )
        self.adaptive, self.target_quantile, self.clip_lr, self.count_noise = (
            adaptive,
            target_quantile,
            clip_lr,
            count_noise,
        )
        accounting_library()  # the run's ledger needs it: without it, stop now in one line

    def count_std(self, expected: float) -> float:
        """σ_b, the standard deviation of the noise on the count of unclipped updates (default m/20, the paper's)."""
        return self.count_noise if self.count_noise is not None else expected / 20

    def update_multiplier(self, expected: float) -> float:
        """z_Δ: the noise multiplier of the update sum (z itself with fixed clipping)."""
        if not self.adaptive:
            return self.noise_multiplier
        rest = self.noise_multiplier**-2 - (2 * self.count_std(expected)) ** -2
        if rest <= 0:
            raise ValueError(
                f"dp.count_noise={self.count_std(expected):g} is too small for noise_multiplier="
                f"{self.noise_multiplier}: 2·count_noise must exceed noise_multiplier; set dp.count_noise, "
                f"e.g. {self.noise_multiplier:g}"
            )
        return rest**-0.5

    def noisy_mean(
        self,
        seed: int,
        round_num: int,
        global_params: torch.Tensor,
        params: Sequence[torch.Tensor],
        expected: float,
        clip_norm: float,
    ) -> tuple[torch.Tensor, dict[str, float], float]:
        """(the noisy mean update, the round's ``dp/`` metrics, the next round's clip norm) for the clients' weights
        ``params``, summed in client-id order in float64."""
        generator = torch.Generator().manual_seed(dp_seed(seed, round_num))
        total = torch.zeros(global_params.numel(), dtype=torch.float64)
        start = global_params.double()
        unclipped = 0
        for p in params:
            delta = p.double() - start  # never in place: p.double() is p itself for float64 weights
            norm = float(torch.linalg.vector_norm(delta))
            unclipped += norm <= clip_norm
            total.add_(delta, alpha=min(1.0, clip_norm / norm) if norm > 0 else 1.0)
        metrics = {"dp/clip_norm": clip_norm, "dp/cohort": float(len(params))}
        next_clip = clip_norm
        if self.adaptive:
            noisy_count = (unclipped - len(params) / 2) + float(
                torch.randn((), generator=generator, dtype=torch.float64)
            ) * self.count_std(expected)
            estimate = noisy_count / expected + 0.5
            next_clip = clip_norm * math.exp(-self.clip_lr * (estimate - self.target_quantile))
            metrics["dp/unclipped_estimate"] = estimate
        noise = torch.randn(global_params.numel(), generator=generator, dtype=torch.float64)
        total += noise * (self.update_multiplier(expected) * clip_norm)
        return (total / expected).to(global_params.dtype), metrics, next_clip

    def describe(self) -> dict[str, Any]:
        return {
            "noise_multiplier": self.noise_multiplier,
            "clip_norm": self.clip_norm,
            "delta": self.delta,
            "adaptive": self.adaptive,
            "accountant": self.accountant,
        }
