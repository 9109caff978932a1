"""Properties of the server halves of the client-side algorithms, FedProx and SCAFFOLD (issue #4):
aggregation ignores the order of the clients, and identical clients (every client returns the global
weights, the interpretation of tests/strategy/test_fedavg.py and friends) leave the model unchanged.

SCAFFOLD is stateful, so its order property compares two fresh strategies whose stores (memory or
disk) start identical: the same round presented sorted by client id (as the server does) and shuffled
must give the same global weights, the same c and bitwise the same stored client control variates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsim.core.params import ParamLayout
from fedsim.core.types import ClientUpdate
from fedsim.strategy import ControlCorrection, FedAvg, FedProx, Scaffold
from fedsim.strategy.context import RunContext
from fedsim.strategy.scaffold import STATE_KEY, correction

_finite = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, allow_infinity=False, width=32)
_integral = st.integers(-1024, 1024).map(float)  # float32 sums and differences of these are exact
_steps = st.integers(1, 50).map(float)
_lrs = st.sampled_from([1.0, 0.5, 0.1, 0.03, 0.01])
_mus = st.sampled_from([0.0, 0.01, 1.0, 10.0])


def _close_up_to_one_ulp(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal up to the float32 rounding of a float64 sum folded in another order.

    Both sides are float64 sums of the same float32 terms, which differ by ~1e-15 relative to the largest
    term (≤ ~2e6 here), far below ``atol``; rounding that to float32 moves the result by at most one ulp,
    i.e. at most 2⁻²³ relative.
    """
    torch.testing.assert_close(got, expected, rtol=2.0**-23, atol=1e-6)


# --- FedProx -------------------------------------------------------------------------------------------

FedProxRound = tuple[torch.Tensor, list[ClientUpdate], list[int]]


@st.composite
def _fedprox_rounds(draw: st.DrawFn) -> FedProxRound:
    """Global weights, 1..6 clients sorted by id (stragglers' small counts included), a permutation."""
    dim, k = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    vector = st.lists(_finite, min_size=dim, max_size=dim)
    x = torch.tensor(draw(vector), dtype=torch.float32)
    ids = sorted(draw(st.lists(st.integers(0, 99), min_size=k, max_size=k, unique=True)))
    updates = [
        ClientUpdate(cid, 1, torch.tensor(draw(vector), dtype=torch.float32), draw(st.integers(1, 1000))) for cid in ids
    ]
    return x, updates, draw(st.permutations(range(k)))


@settings(max_examples=50, deadline=None)
@given(_fedprox_rounds(), _mus)
def test_fedprox_ignores_client_order(case: FedProxRound, mu: float) -> None:
    x, updates, perm = case
    in_order = FedProx(mu=mu).aggregate(1, x, updates)
    shuffled = FedProx(mu=mu).aggregate(1, x, [updates[i] for i in perm])
    _close_up_to_one_ulp(shuffled, in_order)  # weighted_average folds in the given order


@settings(max_examples=50, deadline=None)
@given(_fedprox_rounds(), _mus)
def test_fedprox_server_half_is_fedavg_bitwise_whatever_mu(case: FedProxRound, mu: float) -> None:
    x, updates, perm = case
    for order in (updates, [updates[i] for i in perm]):
        assert torch.equal(FedProx(mu=mu).aggregate(1, x, order), FedAvg().aggregate(1, x, order))


@settings(max_examples=50, deadline=None)
@given(st.lists(_finite, min_size=1, max_size=6), st.lists(st.integers(1, 10_000), min_size=1, max_size=6), _mus)
def test_fedprox_identical_clients_leave_the_model_unchanged(values: list[float], sizes: list[int], mu: float) -> None:
    # Σ (nᵢ/N)·x with Σ nᵢ/N = 1 (up to float64 rounding) rounds back to x exactly in float32.
    strategy, x = FedProx(mu=mu), torch.tensor(values, dtype=torch.float32)
    for round_num in (1, 2, 3):
        updates = [ClientUpdate(i, round_num, x.clone(), n) for i, n in enumerate(sizes)]
        assert torch.equal(strategy.aggregate(round_num, x, updates), x)


# --- SCAFFOLD --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScaffoldCase:
    """One round and the strategy state it starts from (c, N, and the stored client control variates)."""

    x: torch.Tensor
    updates: list[ClientUpdate]  # sorted by client id, as the server passes them
    perm: list[int]
    control: torch.Tensor | None  # None: the first round
    client_states: dict[int, torch.Tensor]  # includes clients not in this round
    num_clients: int
    server_lr: float


def _metrics(draw: st.DrawFn) -> dict[str, float]:
    return {"local_steps": draw(_steps), "lr": draw(_lrs)}


@st.composite
def _scaffold_cases(draw: st.DrawFn, values: st.SearchStrategy[float] = _finite) -> ScaffoldCase:
    dim, k = draw(st.integers(1, 4)), draw(st.integers(1, 6))

    def vector(elements: st.SearchStrategy[float] = _finite) -> torch.Tensor:
        return torch.tensor(draw(st.lists(elements, min_size=dim, max_size=dim)), dtype=torch.float32)

    x = vector()
    ids = draw(st.lists(st.integers(0, 29), min_size=k, max_size=k, unique=True))
    updates = [ClientUpdate(cid, 3, vector(), draw(st.integers(1, 100)), metrics=_metrics(draw)) for cid in sorted(ids)]
    control = vector(values) if draw(st.booleans()) else None
    stored = draw(st.lists(st.integers(0, 29), max_size=10, unique=True)) if control is not None else []
    return ScaffoldCase(
        x=x,
        updates=updates,
        perm=draw(st.permutations(range(k))),
        control=control,
        client_states={cid: vector(values) for cid in stored},
        num_clients=draw(st.sampled_from([0, 30, 100])),
        server_lr=draw(st.sampled_from([1.0, 0.5, 2.0])),
    )


def _scaffold(case: ScaffoldCase) -> Scaffold:
    """A fresh SCAFFOLD starting from the case's server state (c, N)."""
    strategy = Scaffold(server_lr=case.server_lr)
    strategy.setup(
        RunContext(
            layout=ParamLayout.of(torch.nn.Linear(1, 1)),
            num_clients=case.num_clients,
            num_examples=(1,) * case.num_clients,
            clients_per_round=1,
            num_rounds=5,
            seed=0,
        )
    )
    strategy.load_state_dict({"control": None if case.control is None else case.control.clone()})
    return strategy


def _client_states(
    strategy: Scaffold, case: ScaffoldCase, x: torch.Tensor, updates: list[ClientUpdate]
) -> dict[int, dict]:
    """Each client's state after its task: what the client half's update_state makes of the case's cᵢ."""
    states = {}
    for update in updates:
        state = (
            {STATE_KEY: case.client_states[update.client_id].clone()} if update.client_id in case.client_states else {}
        )
        ControlCorrection().update_state(state, strategy.client_config(update.round_num, update.client_id), x, update)
        states[update.client_id] = state
    return states


@settings(max_examples=40, deadline=None)
@given(_scaffold_cases())
def test_scaffold_ignores_client_order(case: ScaffoldCase) -> None:
    shuffled = [case.updates[i] for i in case.perm]
    outcomes = []
    for order in (case.updates, shuffled):
        strategy = _scaffold(case)
        states = _client_states(strategy, case, case.x, order)  # before aggregate: the tasks saw the round's c
        outcomes.append((strategy.aggregate(3, case.x, order), strategy.control.clone(), states))
    (x_sorted, c_sorted, states_sorted), (x_shuffled, c_shuffled, states_shuffled) = outcomes
    # each cᵢ⁺ depends on client i alone: bitwise equal whatever the order
    assert states_sorted.keys() == states_shuffled.keys()
    assert all(torch.equal(states_sorted[c][STATE_KEY], states_shuffled[c][STATE_KEY]) for c in states_sorted)
    # x and c are float64 sums over the clients, folded in the given order
    _close_up_to_one_ulp(x_shuffled, x_sorted)
    _close_up_to_one_ulp(c_shuffled, c_sorted)


@settings(max_examples=40, deadline=None)
@given(_scaffold_cases(values=_integral))
def test_scaffold_identical_clients_leave_the_model_unchanged(case: ScaffoldCase) -> None:
    # Every client returns x: the weight deltas are exactly 0, so x + η_g·0 = x bitwise, whatever the
    # control variates; cᵢ⁺ = cᵢ − c + 0 = cᵢ − c bitwise; and c⁺ = c + (1/N')·Σ(cᵢ⁺ − cᵢ) = c·(1 − n/N'),
    # N' = max(N, n). The controls start as integers, so in the first round that last identity is exact
    # in float32 up to the final float64 → float32 rounding (hence one ulp).
    strategy = _scaffold(case)
    x, n, states = case.x, len(case.updates), dict(case.client_states)
    for round_num in (3, 4, 5):
        c = torch.zeros_like(x) if strategy.control is None else strategy.control.clone()
        updates = [ClientUpdate(u.client_id, round_num, x.clone(), u.num_examples, u.metrics) for u in case.updates]
        after = _client_states(strategy, ScaffoldCase(**{**case.__dict__, "client_states": states}), x, updates)
        assert torch.equal(strategy.aggregate(round_num, x, updates), x)
        for cid, state in after.items():
            before = states.get(cid)
            assert torch.equal(state[STATE_KEY], -c if before is None else before - c)
            states[cid] = state[STATE_KEY]
        if round_num == 3:  # later rounds start from a non-integral c, where cᵢ − c rounds
            shrink = 1.0 - n / max(case.num_clients, n)
            _close_up_to_one_ulp(strategy.control, (c.double() * shrink).float())


@settings(max_examples=30, deadline=None)
@given(
    st.lists(_finite, min_size=1, max_size=5),
    st.lists(st.integers(0, 19), min_size=1, max_size=6, unique=True),
    st.lists(st.tuples(_steps, _lrs), min_size=6, max_size=6),
)
def test_scaffold_with_zero_controls_identical_clients_change_nothing(
    values: list[float], ids: list[int], k_lr: list[tuple[float, float]]
) -> None:
    # A fresh SCAFFOLD (c = cᵢ = 0) whose clients all return x: x, c and every cᵢ stay exactly as they were
    # (x, 0, 0) round after round, and the correction sent to clients stays 0.
    x = torch.tensor(values, dtype=torch.float32)
    case = ScaffoldCase(x=x, updates=[], perm=[], control=None, client_states={}, num_clients=20, server_lr=1.0)
    strategy, states = _scaffold(case), {}
    for round_num in (1, 2, 3):
        updates = [
            ClientUpdate(cid, round_num, x.clone(), 5, {"local_steps": k, "lr": lr})
            for cid, (k, lr) in zip(sorted(ids), k_lr, strict=False)
        ]
        after = _client_states(strategy, ScaffoldCase(**{**case.__dict__, "client_states": states}), x, updates)
        assert torch.equal(strategy.aggregate(round_num, x, updates), x)
        assert torch.equal(strategy.control, torch.zeros_like(x))
        states = {cid: state[STATE_KEY] for cid, state in after.items()}
        assert all(torch.equal(states[cid], torch.zeros_like(x)) for cid in ids)
        for cid in ids:
            assert not torch.any(correction(strategy.client_config(round_num + 1, cid), {STATE_KEY: states[cid]}))
