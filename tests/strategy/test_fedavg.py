"""FedAvg and the pure aggregation math under it: hand-computed answers and properties."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsim.core.types import ClientUpdate
from fedsim.strategy import FedAvg, Strategy
from fedsim.strategy.functional import weighted_average


def _update(client_id: int, values: list[float], n: int) -> ClientUpdate:
    return ClientUpdate(
        client_id=client_id, round_num=1, params=torch.tensor(values, dtype=torch.float32), num_examples=n
    )


# --- known answers -----------------------------------------------------------------------------


def test_two_clients_known_answer() -> None:
    # (1·[1, 2] + 3·[3, 6]) / 4 = [10, 20] / 4
    updates = [_update(0, [1.0, 2.0], 1), _update(1, [3.0, 6.0], 3)]
    new = FedAvg().aggregate(1, torch.zeros(2), updates)
    assert new.dtype == torch.float32 and new.shape == (2,)
    assert torch.equal(new, torch.tensor([2.5, 5.0]))


def test_three_clients_known_answer() -> None:
    # n = 2, 1, 1 (total 4):  x = (2·0 + 3 + 6) / 4,  y = (2·1 + 1 - 2) / 4,  z = (2·-1 + 2 + 5) / 4
    updates = [_update(0, [0.0, 1.0, -1.0], 2), _update(3, [3.0, 1.0, 2.0], 1), _update(7, [6.0, -2.0, 5.0], 1)]
    new = FedAvg().aggregate(4, torch.full((3,), 100.0), updates)
    assert torch.equal(new, torch.tensor([2.25, 0.25, 1.25]))


def test_equal_sizes_give_the_plain_mean() -> None:
    updates = [_update(0, [1.0, -4.0], 5), _update(1, [3.0, 0.0], 5)]
    assert torch.equal(FedAvg().aggregate(1, torch.zeros(2), updates), torch.tensor([2.0, -2.0]))


def test_one_client_is_returned_as_is() -> None:
    params = torch.tensor([0.1, -7.25, 3.0e-5])
    new = FedAvg().aggregate(1, torch.zeros(3), [ClientUpdate(4, 1, params, 17)])
    assert torch.equal(new, params)


def test_global_params_do_not_enter_the_average_and_are_not_modified() -> None:
    updates = [_update(0, [1.0, 2.0], 1), _update(1, [3.0, 6.0], 3)]
    global_a, global_b = torch.zeros(2), torch.tensor([-50.0, 50.0])
    kept = global_b.clone()
    assert torch.equal(FedAvg().aggregate(1, global_a, updates), FedAvg().aggregate(1, global_b, updates))
    assert torch.equal(global_b, kept)
    assert torch.equal(updates[0].params, torch.tensor([1.0, 2.0]))  # inputs untouched


def test_weighted_average_known_answer_and_float_weights() -> None:
    vectors = [torch.tensor([2.0, 4.0]), torch.tensor([6.0, 8.0])]
    assert torch.equal(weighted_average(vectors, [0.25, 0.75]), torch.tensor([5.0, 7.0]))
    assert torch.equal(weighted_average(vectors, [1, 3]), torch.tensor([5.0, 7.0]))  # only ratios matter


def test_weighted_average_accumulates_in_float64() -> None:
    # Around 2**24 float32 values are spaced 2 apart. The exact mean 2**24 + 3 rounds (half to even)
    # to 2**24 + 4; folding the four scaled terms in float32 would round partial sums and end at 2**24 + 2.
    base = 2.0**24
    vectors = [torch.tensor([base + d]) for d in (0.0, 2.0, 4.0, 6.0)]
    assert torch.equal(weighted_average(vectors, [1, 1, 1, 1]), torch.tensor([base + 4.0]))


def test_weighted_average_keeps_dtype_and_shape() -> None:
    vectors = [torch.ones(2, 3, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.float64)]
    out = weighted_average(vectors, [1, 3])
    assert out.dtype == torch.float64 and out.shape == (2, 3)
    assert torch.equal(out, torch.full((2, 3), 0.25, dtype=torch.float64))


# --- bad input ---------------------------------------------------------------------------------


def test_weighted_average_rejects_empty_input() -> None:
    with pytest.raises(ValueError, match="at least one"):
        weighted_average([], [])


@pytest.mark.parametrize("weights", [[0, 0], [0.0, 0.0], [1, -1], [-2, 1]])
def test_weighted_average_rejects_non_positive_total_weight(weights: list[float]) -> None:
    with pytest.raises(ValueError, match="total weight must be positive"):
        weighted_average([torch.ones(2), torch.zeros(2)], weights)


def test_weighted_average_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="2 vectors but 1 weights"):
        weighted_average([torch.ones(2), torch.zeros(2)], [1])


def test_fedavg_rejects_clients_without_examples() -> None:
    with pytest.raises(ValueError, match="total weight"):
        FedAvg().aggregate(1, torch.zeros(2), [_update(0, [1.0, 1.0], 0), _update(1, [2.0, 2.0], 0)])


# --- properties ----------------------------------------------------------------------------------

_finite = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, allow_infinity=False, width=32)


@st.composite
def _rounds(draw: st.DrawFn) -> tuple[list[ClientUpdate], list[int]]:
    """2..6 clients with vectors of one common length, and a permutation of them."""
    dim = draw(st.integers(1, 5))
    k = draw(st.integers(2, 6))
    updates = [
        ClientUpdate(
            client_id=i,
            round_num=1,
            params=torch.tensor(draw(st.lists(_finite, min_size=dim, max_size=dim)), dtype=torch.float32),
            num_examples=draw(st.integers(1, 1000)),
        )
        for i in range(k)
    ]
    return updates, draw(st.permutations(range(k)))


@settings(max_examples=60, deadline=None)
@given(_rounds())
def test_order_of_updates_does_not_matter(case: tuple[list[ClientUpdate], list[int]]) -> None:
    updates, perm = case
    a = FedAvg().aggregate(1, torch.zeros_like(updates[0].params), updates)
    b = FedAvg().aggregate(1, torch.zeros_like(updates[0].params), [updates[i] for i in perm])
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(_rounds())
def test_matches_a_float64_numpy_reference(case: tuple[list[ClientUpdate], list[int]]) -> None:
    updates, _ = case
    stacked = np.stack([u.params.numpy().astype(np.float64) for u in updates])
    n = np.array([u.num_examples for u in updates], dtype=np.float64)
    expected = torch.from_numpy((n[:, None] * stacked).sum(0) / n.sum()).float()
    got = FedAvg().aggregate(1, torch.zeros_like(updates[0].params), updates)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(_finite, min_size=1, max_size=8),
    st.lists(st.integers(1, 10_000), min_size=1, max_size=7),
)
def test_identical_clients_leave_the_model_unchanged(values: list[float], sizes: list[int]) -> None:
    global_params = torch.tensor(values, dtype=torch.float32)
    updates = [ClientUpdate(i, 1, global_params.clone(), n) for i, n in enumerate(sizes)]
    assert torch.equal(FedAvg().aggregate(1, global_params, updates), global_params)


@settings(max_examples=40, deadline=None)
@given(_rounds())
def test_result_lies_within_the_clients_range(case: tuple[list[ClientUpdate], list[int]]) -> None:
    updates, _ = case
    stacked = torch.stack([u.params for u in updates])
    got = FedAvg().aggregate(1, torch.zeros_like(updates[0].params), updates)
    assert torch.all(got >= stacked.min(0).values) and torch.all(got <= stacked.max(0).values)


# --- the Strategy defaults FedAvg inherits ---------------------------------------------------------


def test_fedavg_is_a_stateless_strategy_with_fresh_client_configs() -> None:
    strategy = FedAvg()
    assert isinstance(strategy, Strategy)
    assert strategy.state_dict() == {}
    strategy.load_state_dict({})
    first = strategy.client_config(1, 0)
    first["epochs"] = 99
    assert strategy.client_config(1, 0) == {}  # a fresh dict every call


def test_base_strategy_requires_aggregate() -> None:
    with pytest.raises(NotImplementedError, match="aggregate"):
        Strategy().aggregate(1, torch.zeros(1), [_update(0, [1.0], 1)])
