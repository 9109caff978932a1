"""The privacy ledger against Google's dp-accounting library (its RDP and PLD accountants) and against published
values."""

from __future__ import annotations

import math

import numpy as np
import pytest

dp_accounting = pytest.importorskip("dp_accounting")

from fedsim.privacy.accountant import PrivacyLedger  # noqa: E402


def _library_epsilon(q: float, z: float, rounds: int, delta: float) -> float:
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds)
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize(
    ("q", "z", "rounds", "delta"), [(0.01, 4.0, 10_000, 1e-5), (1 / 3, 1.0, 30, 1e-5), (0.1, 0.8, 200, 1e-6)]
)
def test_epsilon_is_the_librarys_own_value(q: float, z: float, rounds: int, delta: float) -> None:
    ledger = PrivacyLedger(q, z, delta)
    assert ledger.epsilon(rounds) == pytest.approx(_library_epsilon(q, z, rounds, delta), rel=1e-12)


def test_the_rdp_curve_reproduces_the_published_dp_sgd_value() -> None:
    """Abadi et al., "Deep Learning with Differential Privacy", CCS 2016, §3.1: q = 0.01, σ = 4, δ = 1e-5 and
    T = 10,000 steps give ε ≈ 1.26 with the moments accountant, whose conversion is ε = min_λ (RDP(λ)·T + log(1/δ)) /
    ... = min_α T·RDP(α) + log(1/δ)/(α − 1). The library's RDP curve with that classic conversion gives 1.26; the
    library's own (tighter, Balle et al. 2020) conversion, which fedsim reports, gives less."""
    ledger = PrivacyLedger(0.01, 4.0, 1e-5)
    orders, rdp = np.array(ledger._orders), np.array(ledger._one_round) * 10_000
    classic = float(np.min(rdp + math.log(1 / 1e-5) / (orders - 1)))
    assert classic == pytest.approx(1.26, abs=0.005)
    assert ledger.epsilon(10_000) < classic


def test_epsilon_grows_with_rounds_and_the_ledger_survives_a_state_round_trip() -> None:
    ledger = PrivacyLedger(0.2, 1.1, 1e-5)
    values = [ledger.record() for _ in range(5)]
    assert values == sorted(values) and values[0] > 0 and ledger.epsilon(0) == 0
    copy = PrivacyLedger(0.2, 1.1, 1e-5)
    copy.load_state_dict(ledger.state_dict())
    assert copy.epsilon() == values[-1]
    with pytest.raises(ValueError, match="for q=0.2, z=1.1"):
        PrivacyLedger(0.2, 1.2, 1e-5).load_state_dict(ledger.state_dict())


def _library_pld_epsilon(q: float, z: float, rounds: int, delta: float) -> float:
    accountant = dp_accounting.pld.PLDAccountant()
    accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds)
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize(
    ("q", "z", "rounds", "delta"), [(0.01, 1.0, 1000, 1e-5), (0.1, 0.8, 100, 1e-6), (1.0, 2.0, 5, 1e-5)]
)
def test_pld_epsilon_is_the_librarys_own_value_and_below_rdps(q: float, z: float, rounds: int, delta: float) -> None:
    ledger = PrivacyLedger(q, z, delta, accountant="pld")
    pld = ledger.epsilon(rounds)
    assert pld == _library_pld_epsilon(q, z, rounds, delta)  # the same steps as the library's accountant: bit for bit
    assert 0 < pld < PrivacyLedger(q, z, delta).epsilon(rounds)  # both upper bounds; PLD the tighter one here


def test_without_noise_both_accountants_give_infinity_as_the_library_does() -> None:
    assert _library_pld_epsilon(0.25, 0.0, 3, 1e-5) == _library_epsilon(0.25, 0.0, 3, 1e-5) == math.inf
    for accountant in ("rdp", "pld"):
        ledger = PrivacyLedger(0.25, 0.0, 1e-5, accountant=accountant)
        assert ledger.epsilon(0) == 0.0 and ledger.epsilon(3) == math.inf


def test_the_pld_ledger_survives_a_state_round_trip_and_the_events_carry_over_to_another_accountant() -> None:
    ledger = PrivacyLedger(0.2, 1.1, 1e-5, accountant="pld")
    values = [ledger.record() for _ in range(3)]
    assert values == sorted(values) and values[0] > 0
    state = ledger.state_dict()
    assert state == {"q": 0.2, "z": 1.1, "delta": 1e-5, "rounds": 3, "accountant": "pld"}
    copy = PrivacyLedger(0.2, 1.1, 1e-5, accountant="pld")
    copy.load_state_dict(state)
    assert copy.rounds == 3 and copy.epsilon() == values[-1]
    # the same 3 rounds, converted by RDP (a resume allowed to change dp.accountant); and a checkpoint written
    # before the accountant could be chosen, which holds no name
    for saved in (state, {k: v for k, v in state.items() if k != "accountant"}):
        rdp = PrivacyLedger(0.2, 1.1, 1e-5)
        rdp.load_state_dict(saved)
        assert rdp.rounds == 3 and rdp.epsilon() == _library_epsilon(0.2, 1.1, 3, 1e-5) > values[-1]
    with pytest.raises(ValueError, match="for q=0.2, z=1.1, delta=1e-05, not this run's q=0.2, z=1.2"):
        PrivacyLedger(0.2, 1.2, 1e-5, accountant="pld").load_state_dict(state)


def test_an_unknown_accountant_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"^dp.accountant must be one of rdp, pld \(got 'moments'\)$"):
        PrivacyLedger(0.2, 1.1, 1e-5, accountant="moments")
