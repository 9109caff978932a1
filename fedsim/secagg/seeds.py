"""Every random stream of secure aggregation, a pure function of the run seed, the round and the client (never the
global RNG, never who computes it): the rotation, each client's stochastic rounding, the dropouts, SecAgg+'s graph,
each client's keys and self-mask seed, the polynomials of its Shamir shares, and its distributed-DP noise.

Each stream is a ``numpy.random.SeedSequence`` over ``(seed, SECAGG, purpose, round, ...)``: the domain tag
:data:`SECAGG` keeps them apart from :mod:`fedsim.core.seeding`'s streams, the purpose apart from each other.
"""

from __future__ import annotations

import numpy as np

SECAGG = 45_0000  # the domain tag of secure aggregation's streams (issue #45); fedsim.core.seeding uses 0..9
ROTATION, ROUNDING, DROPOUT, GRAPH, KEYS, SHARES, NOISE = 0, 1, 2, 3, 4, 5, 6


def sequence(seed: int, purpose: int, round_num: int, *more: int) -> np.random.SeedSequence:
    """The seed sequence of one stream: ``purpose`` (one of the constants above) in round ``round_num``."""
    return np.random.SeedSequence([int(seed), SECAGG, purpose, int(round_num), *(int(m) for m in more)])


def stream_seed(seed: int, purpose: int, round_num: int, *more: int) -> int:
    """A non-negative 63-bit seed of one stream (for ``torch.Generator.manual_seed``)."""
    return int(sequence(seed, purpose, round_num, *more).generate_state(1, dtype=np.uint64)[0] >> 1)


def rng(seed: int, purpose: int, round_num: int, *more: int) -> np.random.Generator:
    """A numpy generator of one stream."""
    return np.random.default_rng(sequence(seed, purpose, round_num, *more))


def uniform(seed: int, purpose: int, round_num: int, client_id: int) -> float:
    """One uniform draw in [0, 1) for ``client_id`` in round ``round_num`` (its own stream: the draw does not depend
    on which other clients take part)."""
    return float(rng(seed, purpose, round_num, client_id).random())


def big_integers(seed: int, purpose: int, round_num: int, *more: int, count: int, bits: int) -> list[int]:
    """``count`` independent uniform integers in [0, 2^bits) (``bits`` <= 128), from 128 bits of the stream each."""
    words = sequence(seed, purpose, round_num, *more).generate_state(2 * count, dtype=np.uint64)
    return [((int(words[2 * i]) << 64) | int(words[2 * i + 1])) >> (128 - bits) for i in range(count)]
