"""Side-by-side benchmark of the vmap executor against the process and serial executors and two bounds.

Workload (cross-device style): 100 clients with small local datasets, all 100 trained every round,
epochs=1, batch_size=10, SGD lr=0.01, FedAvg, on multinomial logistic regression (MLR) and the 2NN.
Two datasets (``--data``):

* ``mnist``: MNIST-shaped synthetic images (1×28×28, labels from a random linear teacher), 50 per
  client (5 local steps). MLR has 7,850 parameters, the 2NN 199,210.
* ``synthetic``: the FedProx paper's Synthetic(1,1) (60 features, 10 classes; the MLR benchmark of
  Li et al. 2020), each of the 100 devices its own natural client, sizes lognormal between 20 and 100
  (2 to 10 local steps: unequal clients, so vmap pads and masks). MLR has 610 parameters, the 2NN 54,410.

Contenders (per model):

* ``serial_t1``      ``SerialExecutor(threads=1)``: one client after another
* ``process_w2``     ``ProcessExecutor(devices="cpu", workers=2, threads=1)``: the issue's baseline
* ``vmap_t1`` / ``vmap_t2``  ``VmapExecutor(threads=1 / 2)``, automatic chunk size (128 clients per pass for
                     MLR, 21 for the MNIST 2NN, 77 for the Synthetic 2NN on CPU)
* ``central_t1``     one model, the same number of SGD steps of the same batch size on the union of the
                     round's examples, 1 thread: one-client-at-a-time without any federation overhead
* ``wide_t1`` / ``wide_t2``  one model, as many steps as one client does (5), each on a batch of
                     100 × 10 examples: the same FLOPs as the vmap pass, as one dense model (a bound
                     for what vectorising can reach)

Rounds are interleaved by the shared driver (``harness.run_interleaved``: same load accounting, ``--load N``
for a busy machine). The vmap
executor's final weights are compared with the serial executor's (relative error), the process
executor's bitwise.

Run from the repository root::

    .venv/bin/python experiments/bench/bench_vmap.py --data mnist       # both models, ~2 minutes on 2 cores
    .venv/bin/python experiments/bench/bench_vmap.py --data synthetic
    .venv/bin/python experiments/bench/bench_vmap.py --models mlr --rounds 10
    .venv/bin/python experiments/bench/bench_vmap.py --device cuda:0 --contenders serial_t1,vmap_t1,central_t1,wide_t1
    .venv/bin/python experiments/bench/bench_vmap.py --data mnist --load 1  # busy: results_vmap_mnist_load1.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (timing, reporting, --load)
from workload import (  # noqa: E402  (the shared workload and contenders)
    INPUT_SHAPE,
    Bench,
    CentralContender,
    FedsimContender,
    make_bench,
    mnist_shaped,
    relative_errors,
)

from fedsim.data.partition import iid  # noqa: E402
from fedsim.data.synthetic import synthetic  # noqa: E402
from fedsim.data.tensor_data import TensorData  # noqa: E402
from fedsim.executor import ProcessExecutor, SerialExecutor, VmapExecutor  # noqa: E402
from fedsim.models import MLP2NN, LogisticRegression, McMahanCNN  # noqa: E402

MODELS = {"mlr": LogisticRegression, "2nn": MLP2NN, "cnn": McMahanCNN}
CONTENDERS = ("serial_t1", "process_w2", "vmap_t1", "vmap_t2", "central_t1", "wide_t1", "wide_t2")


def central_on(name: str, bench: Bench, threads: int, device: str) -> CentralContender:
    """``CentralContender`` on ``device`` (the data copied there once, before timing), reading every loss."""
    return CentralContender(name, bench, threads, device, read_every_loss=True)


class WideContender(CentralContender):
    """One model, ``steps-per-client`` SGD steps per round, each on ``per_round × batch_size`` examples."""

    def _train(self, round_num: int) -> None:
        b = self.bench
        ids = b.sampled(round_num)
        union = torch.from_numpy(np.concatenate([b.client_indices[c] for c in ids]))
        gen = torch.Generator().manual_seed(b.seed * 100_003 + round_num)
        steps = max(b.steps([c]) for c in ids)
        width = b.per_round * b.batch_size
        for _ in range(steps):
            idx = union[torch.randint(len(union), (width,), generator=gen)]
            self.optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(self.model(b.data.x[idx]), b.data.y[idx])
            loss.backward()
            self.optimizer.step()
            float(loss.detach())
        self.steps_done.append(steps)


def workload(args: argparse.Namespace) -> tuple[TensorData, list[np.ndarray], tuple[int, ...]]:
    """The training data, every client's row indices, and the input shape."""
    if args.data == "mnist":
        data = mnist_shaped(args.clients * args.examples_per_client, args.seed)
        shares = [s[: args.examples_per_client] for s in iid(data.labels, num_clients=args.clients, seed=args.seed)]
        return data, shares, INPUT_SHAPE
    split = synthetic(
        num_devices=args.clients,
        size_mean_log=3.5,
        size_sigma_log=0.5,
        min_size=20,
        max_size=100,
        test_fraction=0.0,
        seed=args.seed,
    )
    groups = split.train.groups
    assert groups is not None
    return split.train, [np.flatnonzero(groups == k) for k in range(args.clients)], split.train.input_shape


def make_contender(name: str, bench: Bench, log_dir: Path, chunk_size: int | None, device: str):  # noqa: ANN201
    if name == "serial_t1":
        return FedsimContender(name, bench, SerialExecutor(device=device, threads=1), log_dir / name)
    if name == "process_w2":
        return FedsimContender(name, bench, ProcessExecutor(devices=device, workers=2, threads=1), log_dir / name)
    if name.startswith("vmap_t"):
        return FedsimContender(
            name, bench, VmapExecutor(devices=device, chunk_size=chunk_size, threads=int(name[-1])), log_dir / name
        )
    if name == "central_t1":
        return central_on(name, bench, 1, device)
    if name.startswith("wide_t"):
        return WideContender(name, bench, int(name[-1]), device, read_every_loss=True)
    raise ValueError(f"unknown contender {name}")


def ratios(rows: dict[str, dict[str, Any]], stat: str = "median_round_s") -> dict[str, float | None]:
    """Speed-ups of the best vmap row (> 1: vmap is faster)."""
    vmap = min((rows[n][stat] for n in rows if n.startswith("vmap") and rows[n][stat]), default=None)
    return {
        f"{other}/vmap_best": (rows[other][stat] / vmap if other in rows and vmap else None)
        for other in ("process_w2", "serial_t1", "central_t1", "wide_t1", "wide_t2")
    }


def print_table(model: str, rows: dict[str, dict[str, Any]], errors: dict[str, Any], speedups: dict[str, Any]) -> None:
    harness.print_rows(f"{model}: seconds per round (median of timed rounds)", rows)
    print("  ratios:", {k: (round(v, 2) if v else None) for k, v in speedups.items()})
    print("  relative error vs serial_t1:", errors)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--data", default="mnist", choices=("mnist", "synthetic"))
    p.add_argument("--models", default="mlr,2nn", help="comma-separated subset of: " + ",".join(MODELS))
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--per-round", type=int, default=100)
    p.add_argument("--examples-per-client", type=int, default=50, help="--data mnist only")
    p.add_argument("--chunk-size", type=int, default=None, help="default: the executor's own choice (auto)")
    p.add_argument("--device", default="cpu", help="cpu or cuda:0: where every contender trains")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    harness.add_common_args(p, repeats=("--rounds", 5, "timed rounds"), warmup=1)  # --out: results_vmap_<data>.json
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    data, shares, input_shape = workload(args)
    report = harness.new_report(args, harness.HERE / f"results_vmap_{args.data}.json")
    report["models"] = {}
    with tempfile.TemporaryDirectory(prefix="fedsim-bench-vmap-") as tmp, harness.busy_machine(args.load) as load:
        for model in args.models.split(","):
            bench = make_bench(model, data, shares, args, models=MODELS, input_shape=input_shape)
            contenders = [
                make_contender(n, bench, Path(tmp) / model, args.chunk_size, args.device)
                for n in args.contenders.split(",")
            ]
            results = harness.run_interleaved(contenders, bench.total_rounds, tag=model)
            rows = {k: harness.summarize(v, args.warmup) for k, v in results.items()}
            errors, speedups = relative_errors(results), ratios(rows)
            print_table(model, rows, errors, speedups)
            report["models"][model] = {
                "contenders": rows,
                "ratios": speedups,
                "ratios_on_min_round": ratios(rows, "min_round_s"),
                "relative_error_vs_serial": errors,
                "num_params": bench.num_params(),
            }
    report["load"] = load.record()
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
