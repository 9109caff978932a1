"""One round of SecAgg (Bonawitz et al., CCS 2017) or SecAgg+ (Bell et al., CCS 2020), semi-honest variant, with real
arithmetic: the server learns Σ_u x_u mod 2^b over the clients whose masked inputs arrived, and nothing else.

The phases, for the round's cohort U1 (the clients that started it) and the clients U3 ⊆ U1 whose masked inputs
arrived (the survivors; the others dropped out after the keys were shared, so the survivors' inputs carry masks
shared with them):

1. **advertise keys**: each client's public key (:func:`fedsim.secagg.masking.client_keys`);
2. **share keys**: each client Shamir-shares its secret s_u and its self-mask seed b_u among its share holders,
   its neighbours and itself, with threshold t_u = ⌈threshold·(|N(u)| + 1)⌉ (:func:`threshold_of`);
3. **masked input**: each survivor sends y_u (:func:`fedsim.secagg.masking.masked_input`); the server sums them;
4. **unmasking**: each survivor sends, for each of its holders' secrets, its share of b_v (v survived) or of s_v (v
   dropped). From t_v shares the server reconstructs b_v and removes v's self-mask, or s_v and removes, for each
   surviving neighbour u of v, the mask u shares with v (PRG(agree(s_v, g^{s_u}))), which no partner cancelled.

**Failure.** A secret is recovered only from t of its holders; when fewer than t_v of client v's holders survived,
v's mask cannot be removed and the protocol fails: :class:`~fedsim.core.errors.RoundFailedError`, one line naming
the round, the survivors and the threshold. In SecAgg every holder set is the whole cohort, so the round fails
exactly when fewer than t clients survive; in SecAgg+ it fails when some client's neighbourhood lost too many.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedsim.core.errors import RoundFailedError
from fedsim.secagg.masking import ClientKeys, agree, client_keys, expand, masked_input, sign
from fedsim.secagg.seeds import SHARES, big_integers
from fedsim.secagg.shamir import reconstruct, split


def threshold_of(fraction: float, holders: int) -> int:
    """t = ⌈fraction·holders⌉, at least 1: how many of a secret's holders must survive to recover it."""
    return max(1, math.ceil(fraction * holders - 1e-9))


@dataclass(frozen=True)
class RoundSetup:
    """One round's public setting: the run ``seed``, ``round_num``, ``bits``, the ``neighbours`` of every client of
    the cohort (the communication graph), the ``threshold`` fraction and the protocol's name (for messages)."""

    seed: int
    round_num: int
    bits: int
    neighbours: Mapping[int, tuple[int, ...]]
    threshold: float
    protocol: str = "secagg"

    @property
    def cohort(self) -> list[int]:
        """U1: the clients that started the round, sorted."""
        return sorted(self.neighbours)

    def holders(self, client_id: int) -> list[int]:
        """Who holds shares of ``client_id``'s secrets: its neighbours and itself, sorted."""
        return sorted({client_id, *self.neighbours[client_id]})

    def check(self, survivors: Sequence[int]) -> None:
        """Refuse the round (:class:`RoundFailedError`, one line) when some client's secret would be needed and fewer
        than its threshold of its holders survived."""
        alive = set(survivors)
        for client in self.cohort:
            if alive and client not in alive and not alive.intersection(self.neighbours[client]):
                continue  # a dropped client none of whose neighbours survived: no mask of it is left to remove
            holders = self.holders(client)
            t, have = threshold_of(self.threshold, len(holders)), len(alive.intersection(holders))
            if have < t:
                raise RoundFailedError(
                    f"round {self.round_num}: secure aggregation ({self.protocol}) failed: {len(alive)} of "
                    f"{len(self.cohort)} clients survived, and client {client}'s secrets need t={t} of its "
                    f"{len(holders)} share holders (secagg.threshold={self.threshold}) but {have} survived; the run "
                    "stops at the last good round (lower secagg.dropout or secagg.threshold)"
                )


def secret_shares(setup: RoundSetup, client_id: int, keys: ClientKeys) -> tuple[dict[int, int], dict[int, int]]:
    """Phase 2 for ``client_id``: its holders' shares of its secret s_u and of its self-mask seed b_u (polynomials
    from the client's stream (seed, round, client))."""
    holders = setup.holders(client_id)
    t = threshold_of(setup.threshold, len(holders))
    draws = big_integers(setup.seed, SHARES, setup.round_num, client_id, count=2 * (t - 1), bits=127)
    return split(keys.secret, draws[: t - 1], holders), split(keys.self_seed, draws[t - 1 :], holders)


def secure_sum(setup: RoundSetup, inputs: Mapping[int, np.ndarray]) -> np.ndarray:
    """The protocol's output for the survivors' ``inputs`` (each in [0, 2^bits), by client id): Σ inputs mod 2^bits,
    computed only from the masked inputs and the secrets reconstructed from the survivors' shares."""
    survivors = sorted(inputs)
    setup.check(survivors)
    cohort, mask = setup.cohort, np.uint64(2**setup.bits - 1)
    keys = {c: client_keys(setup.seed, setup.round_num, c) for c in cohort}
    shares = {c: secret_shares(setup, c, keys[c]) for c in cohort}
    size = next(iter(inputs.values())).size if inputs else 0
    total = np.zeros(size, dtype=np.uint64)
    for client in survivors:  # phase 3: what reaches the server
        total = total + masked_input(inputs[client], client, keys, setup.neighbours[client], setup.bits)
    alive = set(survivors)
    for client in cohort:  # phase 4: unmasking from t surviving holders' shares
        holders = [h for h in setup.holders(client) if h in alive]
        partners = [u for u in setup.neighbours[client] if u in alive]
        if client not in alive and not partners:
            continue
        t = threshold_of(setup.threshold, len(setup.holders(client)))
        key_shares, seed_shares = shares[client]
        if client in alive:
            total = total - expand(reconstruct({h: seed_shares[h] for h in holders[:t]}), size, setup.bits)
            continue
        secret = reconstruct({h: key_shares[h] for h in holders[:t]})
        for partner in partners:  # the partner's mask with the dropped client, which nobody cancelled
            pair = expand(agree(secret, keys[partner].public), size, setup.bits)
            total = total - pair if sign(partner, client) > 0 else total + pair
    return total & mask


def plain_sum(inputs: Mapping[int, np.ndarray], bits: int) -> np.ndarray:
    """Σ inputs mod 2^bits without any masks: what :func:`secure_sum` must equal, bit for bit."""
    total = np.zeros(next(iter(inputs.values())).size if inputs else 0, dtype=np.uint64)
    for x in inputs.values():
        total = total + x.astype(np.uint64)
    return total & np.uint64(2**bits - 1)
