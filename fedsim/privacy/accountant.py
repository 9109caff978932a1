"""The privacy ledger: ε after every round, from Google's ``dp-accounting`` library (RDP accountant).

Why this library: it is the accountant TensorFlow Privacy and TFF use, maintained by Google's DP team, pure Python
(installs anywhere fedsim does), and its RDP accountant composes exactly the mechanism DP-FedAvg is: each round,
every client takes part independently with probability q (Poisson sampling, which fedsim's sampler then does,
:func:`fedsim.privacy.sampling.poisson_sample`), and the sum of their clipped updates gets Gaussian noise of
standard deviation z·C, C the clip norm (sensitivity C under add-or-remove-one-client adjacency). So a round is
``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` and T rounds their composition; ε is the library's
``RdpAccountant.get_epsilon(δ)`` (its default orders and its RDP-to-(ε, δ) conversion). The guarantee is user-level
(one client's whole data) for the release of every round's model.

The ledger holds the events, not the library's objects, so a checkpoint stores it as plain values and a resumed run
rebuilds the same accountant and gets the same ε.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from fedsim.core.extras import require

NEEDED_BY = "the privacy accountant (dp=central, dp=adaptive, client=dpsgd)"  # Google's dp-accounting


def accounting_library() -> Any:
    """Google's ``dp_accounting``; DP's settings call it when they are built, so that without the library a run
    stops in one line (:class:`~fedsim.core.extras.MissingExtraError`) before any file of the run is written."""
    return require("dp_accounting", NEEDED_BY, "dp", package="dp-accounting")


@dataclass
class PrivacyLedger:
    """Rounds of the Poisson-sampled Gaussian mechanism with sampling rate ``q`` and noise multiplier ``z``.

    RDP composes by addition, so the library computes one round's RDP curve once (its costly part: a tenth of a
    second or more) and ε after T rounds converts T times that curve (``compute_epsilon``, microseconds). A test
    checks the result against the library's own ``compose(event, T).get_epsilon(δ)``."""

    q: float
    z: float
    delta: float
    rounds: int = 0

    def __post_init__(self) -> None:
        self._orders, self._one_round = _one_round_rdp(self.q, self.z)

    def epsilon(self, rounds: int | None = None) -> float:
        """ε at :attr:`delta` after ``rounds`` rounds (default: those recorded); 0 before any."""
        rounds = self.rounds if rounds is None else rounds
        if rounds == 0:
            return 0.0
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        return float(compute_epsilon(self._orders, [r * rounds for r in self._one_round], self.delta)[0])

    def record(self) -> float:
        """Add one round; its ε."""
        self.rounds += 1
        return self.epsilon()

    def state_dict(self) -> dict[str, Any]:
        return {"q": self.q, "z": self.z, "delta": self.delta, "rounds": self.rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["q"], state["z"], state["delta"]) != (self.q, self.z, self.delta):
            raise ValueError(
                f"the checkpoint's privacy ledger is for q={state['q']}, z={state['z']}, delta={state['delta']}, "
                f"not this run's q={self.q}, z={self.z}, delta={self.delta}"
            )
        self.rounds = int(state["rounds"])


def _one_round_rdp(q: float, z: float) -> tuple[list[float], list[float]]:
    """The library's RDP orders and one round's RDP at each. Orders where its series does not converge (small
    orders at large q) are left out of the minimum by the library itself, which logs a warning for each through
    absl; those warnings are silenced here."""
    dp = accounting_library()
    accountant = dp.rdp.RdpAccountant()
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        accountant.compose(dp.PoissonSampledDpEvent(q, dp.GaussianDpEvent(z)))
    finally:
        absl.setLevel(level)
    return list(accountant._orders), list(accountant._rdp)  # noqa: SLF001 - see the class docstring
