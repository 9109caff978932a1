"""One round of SecAgg and SecAgg+ (fedsim/secagg/protocol.py): the masked sum equals the plain modular sum bit for
bit over random cohorts, dropouts, graphs and b; recovery below the threshold, a one-line failure above it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from fedsim.core.errors import RoundFailedError
from fedsim.secagg.masking import complete_graph, harary_graph
from fedsim.secagg.protocol import RoundSetup, plain_sum, secure_sum


def _inputs(clients: list[int], size: int, bits: int, seed: int) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {c: rng.integers(0, 2**bits, size, dtype=np.int64) for c in clients}


def _recoverable(setup: RoundSetup, survivors: set[int]) -> bool:
    """The failure rule, restated: every secret that must be reconstructed has t of its holders alive."""
    for client, neighbours in setup.neighbours.items():
        if survivors and client not in survivors and not survivors & set(neighbours):
            continue
        holders = {client, *neighbours}
        if len(holders & survivors) < max(1, math.ceil(setup.threshold * len(holders) - 1e-9)):
            return False
    return True


@settings(max_examples=120, deadline=None)
@given(
    clients=st.lists(st.integers(0, 60), min_size=1, max_size=14, unique=True),
    bits=st.integers(8, 32),
    size=st.integers(1, 24),
    plus=st.booleans(),
    degree=st.integers(1, 5).map(lambda h: 2 * h),
    threshold=st.floats(0.05, 1.0),
    data=st.data(),
)
def test_the_masked_sum_is_the_plain_modular_sum_bit_for_bit(
    clients: list[int], bits: int, size: int, plus: bool, degree: int, threshold: float, data: st.DataObject
) -> None:
    clients = sorted(clients)
    graph = harary_graph(clients, degree, seed=3, round_num=2) if plus else complete_graph(clients)
    setup = RoundSetup(seed=3, round_num=2, bits=bits, neighbours=graph, threshold=threshold)
    survivors = data.draw(st.lists(st.sampled_from(clients), unique=True))
    inputs = {c: x for c, x in _inputs(clients, size, bits, seed=len(survivors)).items() if c in survivors}
    recoverable = _recoverable(setup, set(survivors))
    event("recovered" if recoverable else "failed")
    if recoverable:
        total = secure_sum(setup, inputs)
        assert total.dtype == np.uint64 and np.array_equal(total, plain_sum(inputs, bits))
    else:
        with pytest.raises(RoundFailedError, match="^round 2: secure aggregation"):
            secure_sum(setup, inputs)


def test_secagg_recovers_below_the_threshold_and_fails_above_it_in_one_line() -> None:
    clients = list(range(10))
    setup = RoundSetup(seed=0, round_num=4, bits=16, neighbours=complete_graph(clients), threshold=0.5)  # t = 5
    inputs = _inputs(clients, 30, 16, seed=0)
    five = {c: inputs[c] for c in (0, 2, 3, 7, 9)}
    assert np.array_equal(secure_sum(setup, five), plain_sum(five, 16))
    four = {c: inputs[c] for c in (0, 2, 3, 7)}
    with pytest.raises(RoundFailedError) as error:
        secure_sum(setup, four)
    assert str(error.value) == (
        "round 4: secure aggregation (secagg) failed: 4 of 10 clients survived, and client 0's secrets need t=5 of "
        "its 10 share holders (secagg.threshold=0.5) but 4 survived; the run stops at the last good round (lower "
        "secagg.dropout or secagg.threshold)"
    )
    with pytest.raises(RoundFailedError, match="0 of 10 clients survived"):
        secure_sum(setup, {})


def test_secagg_plus_fails_when_one_neighbourhood_loses_too_many() -> None:
    """A ring (k = 2) with threshold 1: a survivor's self-mask seed needs all three of its holders (its two
    neighbours and itself). Nine of ten surviving is not enough: the dropped client's neighbours lost one."""
    clients = list(range(10))
    graph = harary_graph(clients, 2, seed=0, round_num=1)
    setup = RoundSetup(0, 1, 16, graph, threshold=1.0, protocol="secagg_plus")
    inputs = _inputs(clients, 8, 16, seed=1)
    assert np.array_equal(secure_sum(setup, inputs), plain_sum(inputs, 16))
    dropped = clients[3]
    with pytest.raises(RoundFailedError, match=r"secure aggregation \(secagg_plus\) failed: 9 of 10 clients survived"):
        secure_sum(setup, {c: x for c, x in inputs.items() if c != dropped})
    half = RoundSetup(0, 1, 16, graph, threshold=0.5, protocol="secagg_plus")  # t = 2 of 3: one loss is recovered
    survivors = {c: x for c, x in inputs.items() if c != dropped}
    assert np.array_equal(secure_sum(half, survivors), plain_sum(survivors, 16))
