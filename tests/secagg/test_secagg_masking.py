"""Shamir sharing over GF(2^127 - 1) (fedsim/secagg/shamir.py) and the masks (fedsim/secagg/masking.py): known
answers, reconstruction from any t shares, the key agreement's symmetry, the Philox expansion, and SecAgg+'s graph."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsim.secagg.masking import (
    agree,
    client_keys,
    complete_graph,
    default_degree,
    expand,
    harary_graph,
    masked_input,
)
from fedsim.secagg.shamir import PRIME, reconstruct, split


def test_shamir_known_answer() -> None:
    """f(x) = 1234 + 166x + 94x² (t = 3): holders 0, 1, 2 get f(1) = 1494, f(2) = 1942, f(3) = 2578; any three
    shares give back 1234; two give the line through them, f(0) = 1494 - (1942 - 1494) = 1046."""
    shares = split(1234, [166, 94], [0, 1, 2, 3])
    assert shares == {0: 1494, 1: 1942, 2: 2578, 3: 3402}
    assert reconstruct({1: 1942, 2: 2578, 3: 3402}) == 1234 and reconstruct({0: 1494, 3: 3402, 1: 1942}) == 1234
    assert reconstruct({0: 1494, 1: 1942}) == 1046
    with pytest.raises(ValueError, match="a secret must be a field element"):
        split(PRIME, [1], [0, 1])


@settings(max_examples=60, deadline=None)
@given(
    secret=st.integers(0, PRIME - 1),
    t=st.integers(1, 8),
    extra=st.integers(0, 6),
    data=st.data(),
)
def test_any_t_shares_reconstruct_the_secret(secret: int, t: int, extra: int, data: st.DataObject) -> None:
    coefficients = data.draw(st.lists(st.integers(0, PRIME - 1), min_size=t - 1, max_size=t - 1))
    holders = data.draw(st.lists(st.integers(0, 10_000), min_size=t + extra, max_size=t + extra, unique=True))
    shares = split(secret, coefficients, holders)
    chosen = data.draw(st.lists(st.sampled_from(holders), min_size=t, max_size=t, unique=True))
    assert reconstruct({h: shares[h] for h in chosen}) == secret


def test_the_key_agreement_is_symmetric_and_keys_are_per_round_and_client() -> None:
    a, b = client_keys(7, 3, 1), client_keys(7, 3, 2)
    assert agree(a.secret, b.public) == agree(b.secret, a.public)
    assert client_keys(7, 3, 1) == a and client_keys(7, 4, 1) != a and a != b
    assert 0 < a.secret < PRIME and 0 <= a.self_seed < PRIME


def test_the_expansion_is_deterministic_and_takes_the_low_bits() -> None:
    for bits in (8, 13, 32):
        mask = expand(12345, 1000, bits)
        assert mask.dtype == np.uint64 and int(mask.max()) < 2**bits
        assert np.array_equal(mask, expand(12345, 1000, bits))
    full = np.random.Philox(key=12345).random_raw(4).astype(np.uint64)
    assert np.array_equal(expand(12345, 4, 32), full & np.uint64(2**32 - 1))


def test_pairwise_masks_cancel_when_everyone_sends() -> None:
    """Masked zero inputs summed over a complete graph leave exactly the self-masks."""
    clients, bits = [2, 5, 9, 11], 12
    keys = {c: client_keys(0, 1, c) for c in clients}
    graph = complete_graph(clients)
    zero = np.zeros(50, dtype=np.int64)
    total = sum(masked_input(zero, c, keys, graph[c], bits).astype(np.uint64) for c in clients)
    selves = sum(expand(keys[c].self_seed, 50, bits) for c in clients)
    assert np.array_equal(np.asarray(total) & np.uint64(2**bits - 1), np.asarray(selves) & np.uint64(2**bits - 1))


@pytest.mark.parametrize(("n", "k"), [(10, 4), (11, 6), (30, 8), (7, 6)])
def test_the_harary_graph_is_k_regular_symmetric_and_drawn_per_round(n: int, k: int) -> None:
    clients = list(range(100, 100 + 3 * n, 3))
    graph = harary_graph(clients, k, seed=0, round_num=1)
    assert all(len(graph[c]) == k and c not in graph[c] for c in clients)
    assert all(c in graph[o] for c in clients for o in graph[c])
    assert harary_graph(clients, k, seed=0, round_num=1) == graph
    assert k == n - 1 or harary_graph(clients, k, seed=0, round_num=2) != graph


def test_the_default_degree_is_of_order_log_n() -> None:
    # the smallest even k >= 3·log2(n), at most n - 1: 3·log2(100) = 19.9, 3·log2(10^4) = 39.9
    assert [default_degree(n) for n in (1, 2, 10, 100, 1000, 10_000)] == [0, 1, 9, 20, 30, 40]
    assert harary_graph([1, 2, 3], 4, 0, 1) == complete_graph([1, 2, 3])
