"""fedsim's Bulyan against Flower's ``aggregate_bulyan`` (with Krum) on random client weights.

Needs Flower (experiments/bench/README.md says how to make its venv); fedsim is taken from this checkout:

    PYTHONPATH=. /work/flower-venv/bin/python experiments/robustness/bulyan_vs_flower.py

Each case: n clients with two layers of weights scattered around a common model, the first f of them attackers
(far away, or sign-flipped and scaled). Prints the largest coordinate difference over all cases. Flower computes in
float32 and picks the values closest to the median with ``argpartition`` (ties in any order); the weights are random,
so ties do not occur.
"""

from __future__ import annotations

import flwr
import numpy as np
import torch
from flwr.server.strategy.aggregate import aggregate_bulyan, aggregate_krum

from fedsim.strategy import Bulyan
from fedsim.types import ClientUpdate

SIZES = [(7, 1), (8, 1), (11, 2), (12, 2), (15, 3), (20, 4), (30, 5)]  # (n, f), n >= 4f + 3
SEEDS = 20


def client_weights(n: int, f: int, seed: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng([seed, n])
    model = [rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal(3).astype(np.float32)]
    clients = [[layer + 0.1 * rng.standard_normal(layer.shape).astype(np.float32) for layer in model] for _ in range(n)]
    for i in range(f):
        clients[i] = [-5 * layer if seed % 2 else layer + 10 for layer in clients[i]]
    return clients


def flat(layers: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.concatenate([layer.ravel() for layer in layers]))


def main() -> None:
    worst, cases = 0.0, 0
    for n, f in SIZES:
        for seed in range(SEEDS):
            clients = client_weights(n, f, seed)
            theirs = aggregate_bulyan(
                [(w, 1) for w in clients], num_malicious=f, aggregation_rule=aggregate_krum, to_keep=0
            )
            updates = [ClientUpdate(i, 1, flat(w), 1) for i, w in enumerate(clients)]
            ours = Bulyan(f=f).aggregate(1, torch.zeros_like(updates[0].params), updates)
            worst = max(worst, float((ours.double() - flat(theirs).double()).abs().max()))
            cases += 1
    print(f"flwr {flwr.__version__}: {cases} cases (n, f in {SIZES}), max |fedsim - flower| = {worst:.3g}")


if __name__ == "__main__":
    main()
