"""What the client halves of FedProx and SCAFFOLD cost per local step: as a loss term vs as a gradient.

FedProx minimises μ/2 ‖w − w_global‖² along with the data loss and SCAFFOLD adds ⟨c − c_i, w⟩. As a
``LocalTraining.loss_term`` (``sum(((p - a) ** 2).sum() for ...)``, what fedsim did until 2026-12-03)
autograd records and walks back 2–3 nodes per parameter tensor on every step, and the term's value is
computed. fedsim's ``ProximalTerm`` and ``ControlCorrection`` now add the closed-form gradient
(μ (w − w_global), c − c_i) to ``p.grad`` in ``LocalTraining.before_step``, a few multi-tensor kernels.
This script times ``Client.fit`` (1 thread, batch 10, SGD) side by side for:

* ``fedavg``            no term (the floor)
* ``fedprox_written``   the proximal term as a loss term (a subclass here)
* ``fedprox``           ``fedsim.strategy.ProximalTerm`` (before_step)
* ``scaffold_written``  the control correction as a loss term (a subclass here)
* ``scaffold``          ``fedsim.strategy.ControlCorrection`` (before_step)

on multinomial logistic regression (Synthetic(1,1) shape: 60 features, 10 classes), the MNIST 2NN
and the MNIST CNN. The contenders alternate within every repetition; the median seconds per local
step over the repetitions are reported, with the ratio to ``fedavg``. It also checks that the loss-term
and gradient forms give the same weights after training (relative difference).

Run from the repository root::

    .venv/bin/python experiments/bench/bench_local_terms.py                 # ~2 minutes on 2 cores
    .venv/bin/python experiments/bench/bench_local_terms.py --models mlr,2nn --repeats 9
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from fedsim.client import Client
from fedsim.data.tensor_data import TensorData
from fedsim.models import LogisticRegression, McMahanCNN, MLP2NN
from fedsim.params import flatten
from fedsim.strategy import ControlCorrection, ProximalTerm
from fedsim.strategy.base import LocalTraining

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_executors import code_version, machine  # noqa: E402

MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "mlr": (lambda: LogisticRegression((60,), 10), (60,)),
    "2nn": (lambda: MLP2NN((1, 28, 28), 10), (1, 28, 28)),
    "cnn": (lambda: McMahanCNN((1, 28, 28), 10), (1, 28, 28)),
}
STEPS = {"mlr": 400, "2nn": 200, "cnn": 40}  # local steps per timed fit: ~0.05–0.5 s each


class WrittenOutProximal(ProximalTerm):
    """The proximal term as a loss term: three autograd nodes per parameter tensor."""

    def before_step(self, model: nn.Module) -> None:
        pass

    def loss_term(self, model: nn.Module) -> torch.Tensor | None:
        squared = sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), self.anchor))
        return 0.5 * self.mu * squared  # type: ignore[return-value]


class WrittenOutCorrection(ControlCorrection):
    """The control correction as a loss term: two autograd nodes per parameter tensor."""

    def before_step(self, model: nn.Module) -> None:
        pass

    def loss_term(self, model: nn.Module) -> torch.Tensor | None:
        return sum((param * piece).sum() for param, piece in self.pieces)  # type: ignore[return-value]


def contenders(num_params: int) -> dict[str, tuple[LocalTraining | None, dict[str, Any]]]:
    """Each contender's client half and round config (μ = 0.01; a random SCAFFOLD correction)."""
    correction = np.random.default_rng(0).normal(scale=0.01, size=num_params).astype(np.float32)
    prox, scaffold = {"prox_mu": 0.01}, {"scaffold_control": correction}  # c; with c_i = 0 the correction is c
    return {
        "fedavg": (None, {}),
        "fedprox_written": (WrittenOutProximal(), prox),
        "fedprox": (ProximalTerm(), prox),
        "scaffold_written": (WrittenOutCorrection(), scaffold),
        "scaffold": (ControlCorrection(), scaffold),
    }


def fit_once(model_name: str, local: LocalTraining | None, config: dict[str, Any]) -> tuple[float, torch.Tensor]:
    """Seconds per local step of one ``Client.fit`` from a fixed initial model, and its final weights."""
    factory, shape = MODELS[model_name]
    steps = STEPS[model_name]
    gen = torch.Generator().manual_seed(0)
    data = TensorData(torch.rand((steps * 10, *shape), generator=gen), torch.randint(0, 10, (steps * 10,), generator=gen), 10)
    torch.manual_seed(0)
    model = factory()
    client = Client(0, np.arange(steps * 10), batch_size=10)
    start = time.perf_counter()
    client.fit(model, data, config=config, generator=torch.Generator().manual_seed(1), local=local)
    return (time.perf_counter() - start) / steps, flatten(model)


def bench_model(model_name: str, repeats: int) -> dict[str, Any]:
    """Alternate the contenders ``repeats`` times (after one untimed pass); median s/step and ratios."""
    num_params = sum(p.numel() for p in MODELS[model_name][0]().parameters())
    chosen = contenders(num_params)
    times: dict[str, list[float]] = {name: [] for name in chosen}
    weights: dict[str, torch.Tensor] = {}
    for repeat in range(repeats + 1):
        for name, (local, config) in chosen.items():
            seconds, weights[name] = fit_once(model_name, local, config)
            if repeat:
                times[name].append(seconds)
        print(f"[{model_name}] repeat {repeat} done", file=sys.stderr, flush=True)
    median = {name: statistics.median(values) for name, values in times.items()}
    return {
        "parameters": num_params,
        "steps_per_fit": STEPS[model_name],
        "median_s_per_step": median,
        "all_s_per_step": times,
        "vs_fedavg": {name: median[name] / median["fedavg"] for name in median},
        "written_over_fused": {
            "fedprox": median["fedprox_written"] / median["fedprox"],
            "scaffold": median["scaffold_written"] / median["scaffold"],
        },
        "rel_weight_diff_fused_vs_written": {
            kind: float((weights[kind] - weights[f"{kind}_written"]).norm() / weights[f"{kind}_written"].norm())
            for kind in ("fedprox", "scaffold")
        },
    }


def print_table(model_name: str, row: dict[str, Any]) -> None:
    print(f"\n{model_name} ({row['parameters']:,} parameters), median over repeats:")
    for name, seconds in row["median_s_per_step"].items():
        print(f"  {name:18s} {seconds * 1e6:9.1f} µs/step   {row['vs_fedavg'][name]:.2f}× fedavg")
    print(f"  loss term / gradient: {row['written_over_fused']}   weights rel. diff: {row['rel_weight_diff_fused_vs_written']}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--models", default="mlr,2nn,cnn", help="comma-separated subset of: " + ",".join(MODELS))
    parser.add_argument("--repeats", type=int, default=7, help="timed repetitions (after one untimed)")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results_local_terms.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results: dict[str, Any] = {"command": " ".join(sys.argv), "code": code_version(), "machine": machine(), "models": {}}
    for model_name in args.models.split(","):
        results["models"][model_name] = bench_model(model_name, args.repeats)
        print_table(model_name, results["models"][model_name])
    args.out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
