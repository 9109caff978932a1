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
and the MNIST CNN. The contenders alternate within every repetition (``harness.run_interleaved``, in a
fixed order; each fit's data and model are built untimed in ``prepare``); the median seconds per local
step over the repetitions are reported, with the ratio to ``fedavg``. It also checks that the loss-term
and gradient forms give the same weights after training (relative difference).

Run from the repository root::

    .venv/bin/python experiments/bench/bench_local_terms.py                 # ~2 minutes on 2 cores
    .venv/bin/python experiments/bench/bench_local_terms.py --models mlr,2nn --repeats 9
    .venv/bin/python experiments/bench/bench_local_terms.py --load 1   # busy machine: results_local_terms_load1.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsim.client import Client
from fedsim.data.tensor_data import TensorData
from fedsim.models import MLP2NN, LogisticRegression, McMahanCNN
from fedsim.params import flatten
from fedsim.strategy import ControlCorrection, ProximalTerm
from fedsim.strategy.base import LocalTraining

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (timing, reporting, --load)

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
        squared = sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), self.anchor, strict=True))
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


class LocalTermFit:
    """One contender for ``harness.run_interleaved``: a round is one ``Client.fit`` from a fixed initial
    model, timed alone (the data, model and client are built in the untimed ``prepare``)."""

    def __init__(self, name: str, model_name: str, local: LocalTraining | None, config: dict[str, Any]) -> None:
        self.name, self.model_name, self.local, self.config = name, model_name, local, config
        self.seconds: list[float] = []

    def prepare(self, round_num: int) -> None:
        factory, shape = MODELS[self.model_name]
        steps = STEPS[self.model_name]
        gen = torch.Generator().manual_seed(0)
        self.data = TensorData(
            torch.rand((steps * 10, *shape), generator=gen), torch.randint(0, 10, (steps * 10,), generator=gen), 10
        )
        torch.manual_seed(0)
        self.model = factory()
        self.client = Client(0, np.arange(steps * 10), batch_size=10)

    def run_round(self, round_num: int) -> None:
        start = time.perf_counter()
        self.client.fit(
            self.model, self.data, config=self.config, generator=torch.Generator().manual_seed(1), local=self.local
        )
        self.seconds.append((time.perf_counter() - start) / STEPS[self.model_name])

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def info(self) -> dict[str, Any]:
        return {"s_per_step": self.seconds, "weights": flatten(self.model)}


def bench_model(model_name: str, repeats: int) -> dict[str, Any]:
    """Alternate the contenders ``repeats`` times (after one untimed pass); median s/step and ratios."""
    num_params = sum(p.numel() for p in MODELS[model_name][0]().parameters())
    chosen = [LocalTermFit(name, model_name, local, config) for name, (local, config) in contenders(num_params).items()]
    rows = harness.run_interleaved(chosen, repeats + 1, tag=model_name, rotate=False)
    times = {name: row["s_per_step"][1:] for name, row in rows.items()}
    weights = {name: row["weights"] for name, row in rows.items()}
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
        "max_others_cores": {name: max(row["others_cores"][1:]) for name, row in rows.items()},
        "median_load_cores": {name: statistics.median(row["load_cores"][1:]) for name, row in rows.items()},
    }


def print_table(model_name: str, row: dict[str, Any]) -> None:
    print(f"\n{model_name} ({row['parameters']:,} parameters), median over repeats:")
    for name, seconds in row["median_s_per_step"].items():
        print(f"  {name:18s} {seconds * 1e6:9.1f} µs/step   {row['vs_fedavg'][name]:.2f}× fedavg")
    print(
        f"  loss term / gradient: {row['written_over_fused']}   "
        f"weights rel. diff: {row['rel_weight_diff_fused_vs_written']}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--models", default="mlr,2nn,cnn", help="comma-separated subset of: " + ",".join(MODELS))
    harness.add_common_args(
        parser, repeats=("--repeats", 7, "timed repetitions (after one untimed)"), warmup=None, quiet_wait=0.0
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results: dict[str, Any] = {
        "command": " ".join(sys.argv),
        **harness.new_report(args, harness.HERE / "results_local_terms.json"),
        "models": {},
    }
    with harness.busy_machine(args.load) as load:
        for model_name in args.models.split(","):
            results["models"][model_name] = bench_model(model_name, args.repeats)
            print_table(model_name, results["models"][model_name])
    results["load"] = load.record()
    harness.write_json(args.out, results)


if __name__ == "__main__":
    main()
