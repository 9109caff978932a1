"""Numbers behind experiments/custom_strategy/README.md: how far clients move, and what the strategies do to it.

Runs the default experiment (Synthetic(1,1), logistic regression, 10 of 30 clients, 10 rounds) through
``fedsim.run`` with each strategy wrapped by a probe that records every client's change ‖client − global‖
before aggregating. Usage, from the repository root:
    PYTHONPATH=experiments/custom_strategy .venv/bin/python experiments/custom_strategy/measure.py
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from my_strategies import AdaptiveClippedFedAvg, L1FedAvg

from fedsim.run import build_server, compose
from fedsim.strategy import FedAvg, Strategy
from fedsim.types import ClientUpdate

ROUNDS = 10


class Probe(Strategy):
    """Delegates to ``inner``; records the L2 and L1 norms of every client's change and the share of
    coordinates that moved by less than 1e-3."""

    def __init__(self, inner: Strategy) -> None:
        self.inner, self.rows = inner, []
        self.keeps_stragglers = inner.keeps_stragglers

    def local_training(self):  # type: ignore[no-untyped-def]
        return self.inner.local_training()

    def client_config(self, round_num: int, client_id: int) -> dict:
        return self.inner.client_config(round_num, client_id)

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        for u in updates:
            delta = u.params.double() - global_params.double()
            self.rows.append(
                (round_num, float(delta.norm()), float(delta.abs().sum()), float((delta.abs() < 1e-3).double().mean()))
            )
        return self.inner.aggregate(round_num, global_params, updates)


def run(inner: Strategy) -> tuple[Probe, float]:
    server = build_server(compose([f"num_rounds={ROUNDS}", "logger=quiet"]))
    server.parts.strategy = probe = Probe(inner)  # replaces FedAvg after build: same data, seed and clients
    history = server.run().history
    return probe, history[-1]["eval/accuracy"]


def main() -> None:
    probe, accuracy = run(FedAvg())
    print(f"FedAvg: final test accuracy {accuracy:.4f}; L2 norm of a client's change per round (min / median / max):")
    for r in range(1, ROUNDS + 1):
        norms = sorted(n for rr, n, _, _ in probe.rows if rr == r)
        print(f"  round {r:2d}: {norms[0]:.3f} / {norms[len(norms) // 2]:.3f} / {norms[-1]:.3f}")
    for lam in (0.0, 0.01, 0.1):
        probe, accuracy = run(L1FedAvg(lam=lam))
        n = len(probe.rows)
        print(
            f"L1FedAvg lam={lam}: mean L1 norm of a client's change {sum(r[2] for r in probe.rows) / n:.2f}, "
            f"share of coordinates moved < 1e-3 {sum(r[3] for r in probe.rows) / n:.3f}, "
            f"final test accuracy {accuracy:.4f}"
        )
    adaptive = AdaptiveClippedFedAvg()
    bounds = [adaptive.max_norm]

    class Recording(Probe):
        def aggregate(self, round_num, global_params, updates):  # type: ignore[no-untyped-def]
            new = super().aggregate(round_num, global_params, updates)
            bounds.append(adaptive.max_norm)
            return new

    server = build_server(compose([f"num_rounds={ROUNDS}", "logger=quiet"]))
    server.parts.strategy = Recording(adaptive)
    accuracy = server.run().history[-1]["eval/accuracy"]
    print(
        f"AdaptiveClippedFedAvg: final test accuracy {accuracy:.4f}; bound C before each round and after the last: "
        + " ".join(f"{c:.3f}" for c in bounds)
    )


if __name__ == "__main__":
    main()
