"""The privacy ledger: ε after every round, from Google's ``dp-accounting`` library (RDP or PLD accountant).

Why this library: it is the accountant TensorFlow Privacy and TFF use, maintained by Google's DP team, pure Python
(installs anywhere fedsim does), and its RDP accountant composes exactly the mechanism DP-FedAvg is: each round,
every client takes part independently with probability q (Poisson sampling, which fedsim's sampler then does,
:func:`fedsim.privacy.sampling.poisson_sample`), and the sum of their clipped updates gets Gaussian noise of
standard deviation z·C, C the clip norm (sensitivity C under add-or-remove-one-client adjacency). So a round is
``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` and T rounds their composition; ε is the library's
``RdpAccountant.get_epsilon(δ)`` (its default orders and its RDP-to-(ε, δ) conversion). The guarantee is user-level
(one client's whole data) for the release of every round's model.

``accountant="pld"`` (``dp.accountant=pld``) converts the same events with the library's privacy loss distribution
accountant instead (``PLDAccountant``, its default discretisation 1e-4, pessimistic): Koskela, Jälkö, Honkela,
"Computing Tight Differential Privacy Guarantees Using FFT", AISTATS 2020; Doroshenko, Ghazi, Kamath, Kumar,
Manurangsi, "Connect the Dots: Tighter Discrete Approximations of Privacy Loss Distributions", PETS 2022. Its ε is
an upper bound as RDP's is, and a tighter one (7 to 41 % lower in the settings of docs/communication.md's table),
at a cost: building one round's distribution takes about a second, once per run, and each new number of rounds
composes it again (a tenth of a second or more, once per round; the ledger keeps every ε it computed).

The ledger holds the events, not the library's objects, so a checkpoint stores it as plain values and a resumed run
rebuilds the same accountant and gets the same ε.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from fedsim.core.extras import require

NEEDED_BY = "the privacy accountant (dp=central, dp=adaptive, client=dpsgd, secagg.dp)"  # Google's dp-accounting
ACCOUNTANTS = ("rdp", "pld")


def check_accountant(name: object, key: str = "dp.accountant") -> str:
    """``name`` if it is one of :data:`ACCOUNTANTS`; otherwise a one-line error naming ``key``."""
    if not isinstance(name, str) or name not in ACCOUNTANTS:
        raise ValueError(f"{key} must be one of {', '.join(ACCOUNTANTS)} (got {name!r})")
    return name


def accounting_library() -> Any:
    """Google's ``dp_accounting``; DP's settings call it when they are built, so that without the library a run
    stops in one line (:class:`~fedsim.core.extras.MissingExtraError`) before any file of the run is written."""
    return require("dp_accounting", NEEDED_BY, "dp", package="dp-accounting")


@dataclass
class PrivacyLedger:
    """Rounds of the Poisson-sampled Gaussian mechanism with sampling rate ``q`` and noise multiplier ``z``, converted
    to ε by ``accountant`` (``"rdp"`` or ``"pld"``, see the module docstring).

    RDP composes by addition, so the library computes one round's RDP curve once (its costly part: a tenth of a
    second or more) and ε after T rounds converts T times that curve (``compute_epsilon``, microseconds). PLD builds
    one round's distribution once and composes it T times (``self_compose``), as the library's ``PLDAccountant``
    does. Tests check both against the library's own ``compose(event, T).get_epsilon(δ)``. With z = 0 (no noise)
    ε is infinite after the first round, the library's answer."""

    q: float
    z: float
    delta: float
    rounds: int = 0
    accountant: str = "rdp"

    def __post_init__(self) -> None:
        check_accountant(self.accountant)
        self._cache: dict[int, float] = {}
        if self.accountant == "rdp":
            self._orders, self._one_round = _one_round_rdp(self.q, self.z)
        else:
            self._pld = _one_round_pld(self.q, self.z)

    def epsilon(self, rounds: int | None = None) -> float:
        """ε at :attr:`delta` after ``rounds`` rounds (default: those recorded); 0 before any."""
        rounds = self.rounds if rounds is None else rounds
        if rounds == 0:
            return 0.0
        if rounds not in self._cache:
            self._cache[rounds] = self._rdp_epsilon(rounds) if self.accountant == "rdp" else self._pld_epsilon(rounds)
        return self._cache[rounds]

    def _rdp_epsilon(self, rounds: int) -> float:
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        return float(compute_epsilon(self._orders, [r * rounds for r in self._one_round], self.delta)[0])

    def _pld_epsilon(self, rounds: int) -> float:
        """The library's ``PLDAccountant`` steps: the identity distribution composed with one round's, self-composed
        ``rounds`` times; infinite without noise."""
        if self._pld is None:
            return math.inf
        from dp_accounting.pld.privacy_loss_distribution import identity

        composed = identity(value_discretization_interval=PLD_INTERVAL).compose(self._pld.self_compose(rounds))
        return float(composed.get_epsilon_for_delta(self.delta))

    def record(self) -> float:
        """Add one round; its ε."""
        self.rounds += 1
        return self.epsilon()

    def state_dict(self) -> dict[str, Any]:
        return {"q": self.q, "z": self.z, "delta": self.delta, "rounds": self.rounds, "accountant": self.accountant}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The recorded rounds of ``state``, which must be for the same q, z and δ. The accountant may differ (the
        resume check refuses that unless ``resume_allow_changes`` names ``dp.accountant``): the events are the same,
        and this ledger's accountant converts them from then on."""
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


PLD_INTERVAL = 1e-4
"""The PLD's value discretisation interval: ``PLDAccountant``'s default."""


def _one_round_pld(q: float, z: float) -> Any:
    """One round's privacy loss distribution, as ``PLDAccountant`` builds it for ``PoissonSampledDpEvent(q,
    GaussianDpEvent(z))`` under add-or-remove-one adjacency; None for z = 0 (no noise: ε is infinite)."""
    dp = accounting_library()
    if z == 0:
        return None
    return dp.pld.privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=z,
        value_discretization_interval=PLD_INTERVAL,
        sampling_prob=q,
        neighboring_relation=dp.NeighboringRelation.ADD_OR_REMOVE_ONE,
    )
