"""The federated workload the benchmarks share, and the contenders more than one of them runs.

The McMahan et al. 2017 MNIST workload with synthetic data (``mnist_shaped``: seeded random 1x28x28 images
labelled by a random linear teacher; ``mnist_clients``: IID or Dirichlet clients), one model's workload (``Bench``),
fedsim's ``Server`` + an executor driven as ``Server.run`` drives it (``FedsimContender``), the centralized
lower bound (``CentralContender``) and a ``Client`` that stamps the start and end of its ``fit``
(``TimedClient``). The contenders follow ``harness.run_interleaved``'s protocol.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedsim import Client, FedAvg, Server, TensorData
from fedsim.data.partition import dirichlet, iid
from fedsim.executor import Executor, Workload
from fedsim.models import MLP2NN, McMahanCNN
from fedsim.seeding import init_seed, sampling_rng
from fedsim.server import Federation, Schedule
from fedsim.types import ClientUpdate

MODELS: dict[str, type[nn.Module]] = {"cnn": McMahanCNN, "2nn": MLP2NN}
INPUT_SHAPE, NUM_CLASSES = (1, 28, 28), 10


def mnist_shaped(num_examples: int, seed: int) -> TensorData:
    """``num_examples`` random 1x28x28 float32 images in [0, 1) with labels from a random linear teacher.

    Made once from a seeded ``torch.Generator``: fixed, learnable (the labels are a function of the
    pixels) and downloaded from nowhere.
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand((num_examples, *INPUT_SHAPE), generator=gen)
    teacher = torch.randn(math.prod(INPUT_SHAPE), NUM_CLASSES, generator=gen)
    y = ((x.reshape(num_examples, -1) - 0.5) @ teacher).argmax(dim=1)
    return TensorData(x, y, NUM_CLASSES)


def add_workload_args(p: argparse.ArgumentParser, models: str | None) -> None:
    """The workload's options (``--models`` defaults to ``models``; no ``--models`` when it is None)."""
    if models is not None:
        p.add_argument("--models", default=models, help="comma-separated subset of: " + ",".join(MODELS))
    p.add_argument("--num-examples", type=int, default=60_000, help="size of the synthetic training set")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument(
        "--partition",
        default="iid",
        choices=("iid", "dirichlet"),
        help="how the examples are split over the clients (dirichlet: label skew, --alpha)",
    )
    p.add_argument("--alpha", type=float, default=0.5, help="--partition dirichlet: the concentration")
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument(
        "--examples-per-client",
        type=int,
        default=None,
        help="keep only this many examples per client (default: all, 600 with the defaults)",
    )
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)


def mnist_clients(args: argparse.Namespace) -> tuple[TensorData, list[np.ndarray]]:
    """The training set and the clients' indices (``--partition``); sets ``args.examples_per_client`` (the median
    client's size) when it was not given."""
    data = mnist_shaped(args.num_examples, args.seed)
    if getattr(args, "partition", "iid") == "dirichlet":
        shares = dirichlet(data.labels, num_clients=args.clients, alpha=args.alpha, seed=args.seed)
    else:
        shares = iid(data.labels, num_clients=args.clients, seed=args.seed)
    if args.examples_per_client is not None:
        shares = [s[: args.examples_per_client] for s in shares]
    args.examples_per_client = args.examples_per_client or int(statistics.median(len(s) for s in shares))
    return data, shares


@dataclass(frozen=True)
class Bench:
    """One model's workload, shared by every contender."""

    name: str
    model_factory: Callable[[], nn.Module]
    data: TensorData
    client_indices: list[np.ndarray]
    per_round: int
    warmup: int
    rounds: int
    epochs: int
    batch_size: int
    lr: float
    seed: int

    @property
    def total_rounds(self) -> int:
        return self.warmup + self.rounds

    def sampled(self, round_num: int) -> list[int]:
        """The clients of ``round_num``: the very ids fedsim's Server samples (same strategy, same rng)."""
        return FedAvg().sample(round_num, len(self.client_indices), self.per_round, sampling_rng(self.seed, round_num))

    def init_model(self) -> nn.Module:
        """The initial global model, built exactly as ``Server.__init__`` builds it."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed(self.seed))
            return self.model_factory()

    def steps(self, client_ids: list[int]) -> int:
        """Local SGD steps of these clients in one round (what fedsim's Client runs)."""
        return sum(self.epochs * math.ceil(len(self.client_indices[c]) / self.batch_size) for c in client_ids)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.model_factory().parameters())


def make_bench(
    model: str,
    data: TensorData,
    shares: list[np.ndarray],
    args: argparse.Namespace,
    models: dict[str, Any] = MODELS,
    input_shape: tuple[int, ...] = INPUT_SHAPE,
) -> Bench:
    factory = functools.partial(models[model], input_shape=input_shape, num_classes=NUM_CLASSES)
    return Bench(
        name=model,
        model_factory=factory,
        data=data,
        client_indices=shares,
        per_round=args.per_round,
        warmup=args.warmup,
        rounds=args.rounds,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
    )


class TimedClient(Client):
    """A plain Client that records when its ``fit`` started and ended (wall clock, seconds)."""

    def fit(self, model, data, **kwargs) -> ClientUpdate:  # type: ignore[no-untyped-def, override]
        start = time.time()
        update = super().fit(model, data, **kwargs)
        return replace(update, metrics={**update.metrics, "t_start": start, "t_end": time.time()})


def synchronize_cuda(devices: list[str]) -> None:
    """Wait until the CUDA devices among ``devices`` have finished their queued work (CPU: no-op).

    Rounds already end synchronised: fedsim's serial and vmap executors copy every update to a CPU
    tensor (which waits for the GPU), process workers hand back results in shared CPU memory, and the
    centralized contenders read a loss after their last step. This is the safeguard that keeps a
    contender that stops doing so from being timed short.
    """
    for device in devices:
        if device.startswith("cuda") and torch.cuda.is_initialized():
            torch.cuda.synchronize(device)


class FedsimContender:
    """fedsim's Server + an executor, driven as ``Server.run`` drives it (start, run_round..., close).

    ``parent_threads``: the server process's own intra-op threads during each round (see ``*_pt1``);
    ``server_threads``: ``Schedule.threads``, the budget ``Server.run_round`` applies to the server's work (fedsim's
    default 1; ``None`` leaves it to ``parent_threads`` or the caller's setting, as before ``run_round`` applied it);
    ``keep_updates``: keep each round's ``ClientUpdate``s (``self.updates``) and metrics (``self.metrics``).
    """

    def __init__(
        self,
        name: str,
        bench: Bench,
        executor: Executor,
        log_dir: Path,
        parent_threads: int | None = None,
        client_cls: type[Client] = Client,
        keep_updates: bool = False,
        server_threads: int | None = 1,
    ) -> None:
        self.name, self.bench, self.executor, self.log_dir = name, bench, executor, log_dir
        self.parent_threads = parent_threads
        optimizer = functools.partial(torch.optim.SGD, lr=bench.lr)
        self.clients = [
            client_cls(i, idx, epochs=bench.epochs, batch_size=bench.batch_size, optimizer=optimizer)
            for i, idx in enumerate(bench.client_indices)
        ]
        self.server = Server(
            model_factory=bench.model_factory,
            federation=Federation(clients=self.clients, train_data=bench.data, test_data=None),
            strategy=FedAvg(),
            executor=executor,
            schedule=Schedule(num_rounds=bench.total_rounds, clients_per_round=bench.per_round, threads=server_threads),
            seed=bench.seed,
        )
        self.updates: list[ClientUpdate] = []
        self.metrics: list[dict[str, Any]] = []
        if keep_updates:
            fit = executor.fit

            def fit_and_keep(global_params: torch.Tensor, tasks: Any) -> Any:
                results = fit(global_params, tasks)
                self.updates = [r for r in results if isinstance(r, ClientUpdate)]
                return results

            executor.fit = fit_and_keep  # type: ignore[method-assign]

    def start(self) -> None:
        self.executor.start(Workload(self.bench.model_factory, self.clients, self.bench.data, log_dir=self.log_dir))

    def run_round(self, round_num: int) -> None:
        previous = torch.get_num_threads()
        if self.parent_threads is not None:
            torch.set_num_threads(self.parent_threads)
        try:
            self.metrics.append(self.server.run_round(round_num))
        finally:
            torch.set_num_threads(previous)

    def synchronize(self) -> None:
        """The devices this contender trains on from THIS process (process workers' devices are not ours)."""
        synchronize_cuda([str(d) for d in getattr(self.executor, "devices", [getattr(self.executor, "device", "cpu")])])

    def close(self) -> None:
        self.executor.close()

    def info(self) -> dict[str, Any]:
        return {"params": self.server.params.clone()}


class CentralContender:
    """One model, the union of each round's sampled clients' examples, the same steps and batch size.

    On a GPU ``device`` the training data is copied there once, here (not timed), and the model lives there;
    each pass's batch order is moved there once and the losses are summed there and read once per round,
    as fedsim's ``Client`` does per epoch (``read_every_loss``, the CPU behaviour, reads each one).
    """

    def __init__(
        self, name: str, bench: Bench, threads: int, device: str = "cpu", read_every_loss: bool | None = None
    ) -> None:
        if device != "cpu":
            bench = replace(
                bench, data=TensorData(bench.data.x.to(device), bench.data.y.to(device), bench.data.num_classes)
            )
        self.name, self.bench, self.threads, self.device = name, bench, threads, device
        self.read_every_loss = device == "cpu" if read_every_loss is None else read_every_loss
        self.steps_done: list[int] = []

    def start(self) -> None:
        self.model = self.bench.init_model().to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=self.bench.lr)
        self.model.train()

    def run_round(self, round_num: int) -> None:
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            self._train(round_num)
        finally:
            torch.set_num_threads(previous)

    def _train(self, round_num: int) -> None:
        b = self.bench
        ids = b.sampled(round_num)
        union = torch.from_numpy(np.concatenate([b.client_indices[c] for c in ids]))
        gen = torch.Generator().manual_seed(b.seed * 100_003 + round_num)
        steps, done = b.steps(ids), 0
        total = torch.zeros((), dtype=torch.float64, device=b.data.x.device)
        while done < steps:
            order = union[torch.randperm(len(union), generator=gen)].to(b.data.x.device)
            for start in range(0, len(order), b.batch_size):
                if done == steps:
                    break
                idx = order[start : start + b.batch_size]
                self.optimizer.zero_grad(set_to_none=True)
                loss = nn.functional.cross_entropy(self.model(b.data.x[idx]), b.data.y[idx])
                loss.backward()
                self.optimizer.step()
                if self.read_every_loss:
                    float(loss.detach())  # the loss is read (on a CPU this costs what fedsim's tensor sum costs)
                else:
                    total += loss.detach().double()  # a GPU is waited for once per round, not once per step
                done += 1
        float(total)
        self.steps_done.append(done)

    def synchronize(self) -> None:
        synchronize_cuda([self.device])

    def close(self) -> None:
        pass

    def info(self) -> dict[str, Any]:
        return {"steps_per_round": self.steps_done}


def relative_errors(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """``‖w − w_serial_t1‖ / ‖w_serial_t1‖`` of every fedsim contender's final weights (0.0: bitwise equal)."""
    ref = results.get("serial_t1", {}).get("params")
    if ref is None:
        return {}
    return {
        k: float((r["params"] - ref).norm() / ref.norm())
        for k, r in results.items()
        if "params" in r and k != "serial_t1"
    }


def split_round(t0: float, t1: float, by_worker: dict[Any, list[tuple[float, float]]]) -> dict[str, float]:
    """Where a round's wall time went (wall clock; every process of this machine shares it): ``head`` from
    the round's start to the first client's start, ``tail`` from the last client's end to the round's end,
    ``gaps`` the summed idle time between two clients on the same worker/actor, ``busy`` the summed time
    inside the clients (fedsim: ``Client.fit``; Flower: the whole ``@app.train()`` function)."""
    starts = [s for iv in by_worker.values() for s, _ in iv]
    ends = [e for iv in by_worker.values() for _, e in iv]
    if not starts:
        return {"wall_s": t1 - t0}
    gaps = [b[0] - a[1] for iv in by_worker.values() for a, b in zip(sorted(iv), sorted(iv)[1:], strict=False)]
    return {
        "wall_s": t1 - t0,
        "head_s": min(starts) - t0,
        "tail_s": t1 - max(ends),
        "gaps_s": sum(gaps),
        "max_gap_s": max(gaps, default=0.0),
        "num_gaps": len(gaps),
        "busy_s": sum(e - s for iv in by_worker.values() for s, e in iv),
        "workers": len(by_worker),
    }
