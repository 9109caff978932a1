"""Properties of the server halves of the client-side algorithms, FedProx and SCAFFOLD (issue #4):
aggregation ignores the order of the clients, and identical clients (every client returns the global
weights, the interpretation of tests/strategy/test_fedavg.py and friends) leave the model unchanged.

SCAFFOLD is stateful, so its order property compares two fresh strategies whose stores (memory or
disk) start identical: the same round presented sorted by client id (as the server does) and shuffled
must give the same global weights, the same c and bitwise the same stored client control variates.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsim.state import DiskStateStore, MemoryStateStore
from fedsim.strategy import FedAvg, FedProx, Scaffold
from fedsim.types import ClientUpdate

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
    updates = [ClientUpdate(cid, 1, torch.tensor(draw(vector), dtype=torch.float32), draw(st.integers(1, 1000)))
               for cid in ids]
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
        x=x, updates=updates, perm=draw(st.permutations(range(k))), control=control,
        client_states={cid: vector(values) for cid in stored}, num_clients=draw(st.sampled_from([0, 30, 100])),
        server_lr=draw(st.sampled_from([1.0, 0.5, 2.0])),
    )


def _scaffold(case: ScaffoldCase, directory: str | None) -> Scaffold:
    """A fresh SCAFFOLD, in memory (``directory=None``) or on disk, starting from the case's state."""
    if directory is None:
        strategy = Scaffold(server_lr=case.server_lr)
    else:
        strategy = Scaffold(server_lr=case.server_lr, state_store="disk", state_dir=directory)
    control = None if case.control is None else case.control.clone()
    states = {cid: s.clone() for cid, s in case.client_states.items()}
    strategy.load_state_dict({"control": control, "num_clients": case.num_clients, "client_states": states})
    return strategy


Outcome = tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]


def _outcome(strategy: Scaffold, x: torch.Tensor, updates: list[ClientUpdate]) -> Outcome:
    """New global weights, new c and every stored client control variate after one round."""
    new = strategy.aggregate(3, x, updates)
    assert strategy.control is not None
    return new, strategy.control.clone(), strategy.store.snapshot()


def _assert_same_states(a: dict[int, torch.Tensor], b: dict[int, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    assert all(torch.equal(a[cid], b[cid]) for cid in a)


@settings(max_examples=40, deadline=None)
@given(_scaffold_cases())
def test_scaffold_ignores_client_order_with_memory_and_disk_stores(case: ScaffoldCase) -> None:
    shuffled = [case.updates[i] for i in case.perm]
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        in_memory = [_scaffold(case, None), _scaffold(case, None)]
        on_disk = [_scaffold(case, d1), _scaffold(case, d2)]
        assert isinstance(in_memory[0].store, MemoryStateStore) and isinstance(on_disk[0].store, DiskStateStore)
        orders = [case.updates, shuffled] * 2
        outcomes = [_outcome(s, case.x, order) for s, order in zip(in_memory + on_disk, orders)]
    (x_sorted, c_sorted, states_sorted), (x_shuffled, c_shuffled, states_shuffled) = outcomes[0], outcomes[1]
    # each cᵢ⁺ depends on client i alone: bitwise equal whatever the order
    _assert_same_states(states_sorted, states_shuffled)
    # x and c are float64 sums over the clients, folded in the given order
    _close_up_to_one_ulp(x_shuffled, x_sorted)
    _close_up_to_one_ulp(c_shuffled, c_sorted)
    # the disk store gives back exactly what the memory store does: same order, same bits
    for memory, disk in ((outcomes[0], outcomes[2]), (outcomes[1], outcomes[3])):
        assert torch.equal(memory[0], disk[0]) and torch.equal(memory[1], disk[1])
        _assert_same_states(memory[2], disk[2])
    # only this round's clients were touched
    for cid, state in case.client_states.items():
        if cid not in {u.client_id for u in case.updates}:
            assert torch.equal(states_sorted[cid], state)


@settings(max_examples=40, deadline=None)
@given(_scaffold_cases(values=_integral), st.booleans())
def test_scaffold_identical_clients_leave_the_model_unchanged(case: ScaffoldCase, on_disk: bool) -> None:
    # Every client returns x: the weight deltas are exactly 0, so x + η_g·0 = x bitwise, whatever the
    # control variates; cᵢ⁺ = cᵢ − c + 0 = cᵢ − c bitwise; and c⁺ = c + (1/N')·Σ(cᵢ⁺ − cᵢ) = c·(1 − n/N'),
    # N' = max(N, n). The controls start as integers, so in the first round that last identity is exact
    # in float32 up to the final float64 → float32 rounding (hence one ulp).
    with tempfile.TemporaryDirectory() as directory:
        strategy = _scaffold(case, directory if on_disk else None)
        x, n = case.x, len(case.updates)
        for round_num in (3, 4, 5):
            c = torch.zeros_like(x) if strategy.control is None else strategy.control.clone()
            old = {u.client_id: strategy.store.get(u.client_id) for u in case.updates}
            updates = [ClientUpdate(u.client_id, round_num, x.clone(), u.num_examples, u.metrics) for u in case.updates]
            assert torch.equal(strategy.aggregate(round_num, x, updates), x)
            for cid, before in old.items():
                expected = -c if before is None else before - c
                assert torch.equal(strategy.store.get(cid), expected)
            if round_num == 3:  # later rounds start from a non-integral c, where cᵢ − c rounds
                shrink = 1.0 - n / max(case.num_clients, n)
                _close_up_to_one_ulp(strategy.control, (c.double() * shrink).float())


@settings(max_examples=30, deadline=None)
@given(st.lists(_finite, min_size=1, max_size=5), st.lists(st.integers(0, 19), min_size=1, max_size=6, unique=True),
       st.lists(st.tuples(_steps, _lrs), min_size=6, max_size=6), st.booleans())
def test_scaffold_with_zero_controls_identical_clients_change_nothing(
    values: list[float], ids: list[int], k_lr: list[tuple[float, float]], on_disk: bool
) -> None:
    # A fresh SCAFFOLD (c = cᵢ = 0) whose clients all return x: x, c and every cᵢ stay exactly as they were
    # (x, 0, 0) round after round, and the correction sent to clients stays 0.
    x = torch.tensor(values, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as directory:
        strategy = Scaffold(state_store="disk", state_dir=directory) if on_disk else Scaffold()
        for round_num in (1, 2, 3):
            strategy.sample(round_num, 20, len(ids), np.random.default_rng(round_num))  # N = 20
            updates = [ClientUpdate(cid, round_num, x.clone(), 5, {"local_steps": k, "lr": lr})
                       for cid, (k, lr) in zip(sorted(ids), k_lr)]
            assert torch.equal(strategy.aggregate(round_num, x, updates), x)
            assert torch.equal(strategy.control, torch.zeros_like(x))
            assert len(strategy.store) == len(ids)
            assert all(torch.equal(strategy.store.get(cid), torch.zeros_like(x)) for cid in ids)
            for cid in ids:
                assert not np.any(strategy.client_config(round_num + 1, cid)["scaffold_correction"])
