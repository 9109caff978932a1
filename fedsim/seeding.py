"""Every random stream's seed, kept at this path for researchers' code: defined in :mod:`fedsim.core.seeding`."""

from fedsim.core.seeding import (
    attack_rng,
    attack_seed,
    cohort_rng,
    comm_seed,
    dp_seed,
    dpsgd_noise_seed,
    init_seed,
    partition_seed,
    root_rng,
    root_seed,
    sampling_rng,
    task_seed,
)

__all__ = [
    "attack_rng",
    "attack_seed",
    "cohort_rng",
    "comm_seed",
    "dp_seed",
    "dpsgd_noise_seed",
    "init_seed",
    "partition_seed",
    "root_rng",
    "root_seed",
    "sampling_rng",
    "task_seed",
]
