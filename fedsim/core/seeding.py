"""Every random stream of a run, derived from the run seed alone (never from the global RNG).

Each stream is a ``numpy.random.SeedSequence`` over ``(seed, domain, ...)``: a domain tag keeps the
sampling, task and initialisation streams apart, so adding a client or a round changes no other stream.
"""

from __future__ import annotations

import numpy as np

_SAMPLING, _TASK, _INIT, _PARTITION, _COHORT, _COMM, _DP, _DPSGD_NOISE, _ATTACK, _ROOT = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9


def _derive(*entropy: int) -> int:
    return int(np.random.SeedSequence([int(e) for e in entropy]).generate_state(1, dtype=np.uint64)[0] >> 1)


def sampling_rng(seed: int, round_num: int) -> np.random.Generator:
    """The generator that picks round ``round_num``'s clients: a pure function of (seed, round)."""
    return np.random.default_rng(np.random.SeedSequence([seed, _SAMPLING, round_num]))


def task_seed(seed: int, round_num: int, client_id: int) -> int:
    """Seed of one client's local training in one round (a non-negative 63-bit integer)."""
    return _derive(seed, _TASK, round_num, client_id)


def init_seed(seed: int) -> int:
    """Seed for the global model's initial weights."""
    return _derive(seed, _INIT)


def partition_seed(seed: int) -> int:
    """Seed for partitioning the data over clients."""
    return _derive(seed, _PARTITION)


def cohort_rng(seed: int) -> np.random.Generator:
    """The generator that draws the fixed evaluation cohort (``evaluate_clients=cohort``) once per run."""
    return np.random.default_rng(np.random.SeedSequence([seed, _COHORT]))


def comm_seed(seed: int, round_num: int, direction: int, client_id: int) -> int:
    """Seed of one encoding: ``direction`` 0 is the round's broadcast of the global model (``client_id`` 0), 1 one
    client's update."""
    return _derive(seed, _COMM, round_num, direction, client_id)


def dp_seed(seed: int, round_num: int) -> int:
    """Seed of a round's central privacy noise (:mod:`fedsim.privacy.central`)."""
    return _derive(seed, _DP, round_num)


def dpsgd_noise_seed(task_seed_value: int) -> int:
    """Seed of a DP-SGD task's gradient noise (:mod:`fedsim.privacy.local`), a stream apart from its batch draws, so
    that an executor may draw all of a task's batches first and its noise later and still get the same numbers."""
    return _derive(task_seed_value, _DPSGD_NOISE)


def attack_rng(seed: int, round_num: int) -> np.random.Generator:
    """The generator that draws the malicious clients (round 0: the run's fixed set; see :mod:`fedsim.attacks`)."""
    return np.random.default_rng(np.random.SeedSequence([seed, _ATTACK, round_num]))


def attack_seed(seed: int, round_num: int, client_id: int) -> int:
    """Seed of one malicious client's draws in one round (e.g. the Gaussian attack's noise)."""
    return _derive(seed, _ATTACK, round_num, client_id)


def root_rng(seed: int) -> np.random.Generator:
    """The generator that draws the server's root dataset (:mod:`fedsim.strategy.root_data`) once per run."""
    return np.random.default_rng(np.random.SeedSequence([seed, _ROOT]))


def root_seed(seed: int, round_num: int) -> int:
    """Seed of the server's training on its root dataset in one round (batch order; a DP-SGD recipe's noise)."""
    return _derive(seed, _ROOT, round_num)
