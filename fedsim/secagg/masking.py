"""The masks of secure aggregation: each client's keys, the pairwise key agreement, the pseudo-random expansion of a
seed into a mask, a client's masked input, and SecAgg+'s communication graph.

**Keys.** Each round, client u draws a secret s_u in [1, p-1) and a self-mask seed b_u in GF(p) from its own
stream (seed, round, u), p = 2^127 - 1, and advertises its public key g^{s_u} mod p (g = 3). Two clients agree on
the pairwise seed s_{u,v} = (g^{s_v})^{s_u} = (g^{s_u})^{s_v} mod p (Diffie–Hellman in GF(p)*: the algebra of the
real protocol's key agreement, not its security, which needs an elliptic curve). A seed becomes a mask by a
counter-based generator: numpy's Philox keyed by the seed's 128 bits, whose raw 64-bit outputs, cut to their low b
bits, are uniform integers mod 2^b.

**Masked input** (Bonawitz et al., CCS 2017, §4): client u sends
y_u = x_u + PRG(b_u) + Σ_{v ∈ N(u), u < v} PRG(s_{u,v}) - Σ_{v ∈ N(u), v < u} PRG(s_{u,v})  (mod 2^b),
N(u) its neighbours: every other client of the round in SecAgg, its neighbours in a random k-regular graph in
SecAgg+ (Bell et al., CCS 2020). Summed over clients that all sent, each pair's masks cancel (one added, one
subtracted). Arithmetic is in uint64, which wraps mod 2^64, a multiple of 2^b: the low b bits are the sum mod 2^b.

**The graph** (SecAgg+): a Harary graph H(k, n) over a random permutation of the round's clients (the paper's
construction): with the clients in permuted order around a ring, each is joined to the k/2 nearest on either side,
so every client has exactly k neighbours (k even, k < n; k >= n - 1 is the complete graph, SecAgg). The permutation
comes from (seed, round): the graph is public, as in the paper, and needs no state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedsim.secagg.seeds import GRAPH, KEYS, big_integers, rng
from fedsim.secagg.shamir import PRIME

GENERATOR = 3


@dataclass(frozen=True)
class ClientKeys:
    """One client's keys in one round: the key-agreement ``secret`` s_u, its ``public`` key g^{s_u} mod p, and the
    ``self_seed`` b_u of its self-mask (the two secrets it Shamir-shares)."""

    secret: int
    public: int
    self_seed: int


def client_keys(seed: int, round_num: int, client_id: int) -> ClientKeys:
    """``client_id``'s keys in round ``round_num``: a pure function of (seed, round, client)."""
    secret, self_seed = big_integers(seed, KEYS, round_num, client_id, count=2, bits=127)
    secret = 1 + secret % (PRIME - 2)
    return ClientKeys(secret, pow(GENERATOR, secret, PRIME), self_seed % PRIME)


def agree(secret: int, public: int) -> int:
    """The pairwise seed of a client with secret ``secret`` and another with public key ``public``."""
    return pow(public, secret, PRIME)


def expand(seed: int, size: int, bits: int) -> np.ndarray:
    """PRG(seed): ``size`` uniform integers in [0, 2^bits) (uint64), Philox keyed by the seed."""
    raw = np.random.Philox(key=seed).random_raw(size)
    return np.asarray(raw, dtype=np.uint64) & np.uint64(2**bits - 1)


def sign(client_id: int, other: int) -> int:
    """+1 when ``client_id`` adds the pair's mask (it comes first), -1 when it subtracts it."""
    return 1 if client_id < other else -1


def masked_input(
    x: np.ndarray, client_id: int, keys: Mapping[int, ClientKeys], neighbours: Sequence[int], bits: int
) -> np.ndarray:
    """y_u: ``client_id``'s input ``x`` (uint64, in [0, 2^bits)) plus its self-mask and its pairwise masks with
    ``neighbours``, mod 2^bits. ``keys``: every client's keys (only the neighbours' public keys are read)."""
    own = keys[client_id]
    y = x.astype(np.uint64) + expand(own.self_seed, x.size, bits)
    for other in neighbours:
        mask = expand(agree(own.secret, keys[other].public), x.size, bits)
        y = y + mask if sign(client_id, other) > 0 else y - mask
    return y & np.uint64(2**bits - 1)


def default_degree(cohort: int) -> int:
    """SecAgg+'s default k for a cohort of n: the smallest even number >= 3·log2(n) (of order log n, as the paper's
    analysis asks; the constant is fedsim's choice, see docs/secure-aggregation.md), at most n - 1."""
    if cohort <= 1:
        return 0
    k = math.ceil(3 * math.log2(cohort))
    return min(cohort - 1, k + k % 2)


def complete_graph(clients: Sequence[int]) -> dict[int, tuple[int, ...]]:
    """SecAgg's graph: every client is every other's neighbour."""
    return {c: tuple(o for o in clients if o != c) for c in clients}


def harary_graph(clients: Sequence[int], degree: int, seed: int, round_num: int) -> dict[int, tuple[int, ...]]:
    """SecAgg+'s graph over ``clients``: the Harary graph H(degree, n) over a permutation drawn from (seed, round)
    (module docstring); the complete graph when ``degree`` >= n - 1. Neighbours sorted by id."""
    n = len(clients)
    if degree >= n - 1:
        return complete_graph(clients)
    order = [clients[i] for i in rng(seed, GRAPH, round_num).permutation(n)]
    links: dict[int, set[int]] = {c: set() for c in clients}
    for i, client in enumerate(order):
        for step in range(1, degree // 2 + 1):
            links[client].update((order[(i + step) % n], order[(i - step) % n]))
    return {c: tuple(sorted(links[c])) for c in clients}
