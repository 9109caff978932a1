"""VmapExecutor: matches the serial reference within float32 tolerance, refuses what it cannot vectorise."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from builders import tiny_federation, tiny_server
from torch import nn

from fedsim.cli.run import build_data, compose, run_config
from fedsim.client.base import Client
from fedsim.client.federation import FederatedData, federate, make_clients
from fedsim.core.params import flatten
from fedsim.core.types import ClientFailure, ClientUpdate, FitTask
from fedsim.data.partition import lognormal
from fedsim.data.tensor_data import DataSplit, TensorData
from fedsim.executor import SerialExecutor, VmapExecutor, VmapUnsupportedError, Workload
from fedsim.executor.vmap.executor import auto_chunk_size
from fedsim.models import MLP2NN, LogisticRegression, McMahanCNN
from fedsim.observe.run_logger import RunLogger
from fedsim.server.server import RunResult
from fedsim.server.settings import Stages
from fedsim.server.stragglers import Stragglers
from fedsim.strategy import FedProx, LocalTraining, Scaffold

UNIT_ROUNDOFF = 2.0**-24  # float32


def tolerance(sequential_steps: int, longest_sum: int) -> float:
    """The relative error of the final weights that float32 rounding alone can produce between two runs of the
    same training whose kernels sum in different orders (vmap's batched kernels against serial's).

    Each step computes sums of up to ``longest_sum`` float32 terms; another summation order changes such a sum
    by about sqrt(longest_sum) unit roundoffs (the rounding errors of a sum add up like a random walk). A run
    applies one such perturbation per step along its longest chain of ``sequential_steps`` dependent steps
    (rounds × a client's local steps), and perturbations of successive steps add up at most linearly."""
    return sequential_steps * math.sqrt(longest_sum) * UNIT_ROUNDOFF


# run(): 3 rounds × at most 2 epochs × ceil(38 / 8) steps. The longest sums: the 60 input features (MLR, 2NN);
# for the CNN on 12×12 images, the first convolution's weight gradient over a batch of 8 × 12 × 12 positions.
TOLERANCE = tolerance(3 * 2 * 5, 60)  # 1.4e-5
CNN_TOLERANCE = tolerance(3 * 2 * 4, 8 * 12 * 12)  # 4.8e-5 (3 rounds × 2 epochs × ceil(25 / 8) steps)


def model_tolerance(model: str) -> float:
    return CNN_TOLERANCE if model == "cnn" else TOLERANCE


def vector_data() -> FederatedData:
    """FedProx's Synthetic(1,1): 8 devices of unequal sizes (20–60 examples), 60 features."""
    return tiny_federation(8, size_sigma_log=0.5)


@functools.lru_cache(maxsize=1)
def image_data() -> FederatedData:
    """160 random 1×12×12 images labelled by a linear teacher, split over 6 clients of lognormal sizes
    (small images: the CNN's cost, not its shape, is what a unit test cannot afford)."""
    g = torch.Generator().manual_seed(5)
    x = torch.rand(160, 1, 12, 12, generator=g)
    y = ((x.flatten(1) - 0.5) @ torch.randn(144, 10, generator=g)).argmax(1)
    split = DataSplit(train=TensorData(x[:120], y[:120], 10), test=TensorData(x[120:], y[120:], 10))
    return federate(
        split, functools.partial(lognormal, num_clients=6, sigma=0.8, min_size=10), client_test_fraction=0.0, seed=1
    )


MODELS = {
    "mlr": (vector_data, functools.partial(LogisticRegression, input_shape=(60,), num_classes=10)),
    "2nn": (vector_data, functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=32)),
    "cnn": (image_data, functools.partial(McMahanCNN, input_shape=(1, 12, 12), num_classes=10)),
}


def run(
    executor,
    model: str = "2nn",
    strategy=None,
    optimizer=None,
    stragglers=None,
    rounds: int = 3,
    client_cls=Client,
    per_round: int = 4,
) -> RunResult:
    data_fn, model_factory = MODELS[model]
    kwargs = {"epochs": 2, "batch_size": 8} | ({"optimizer": optimizer} if optimizer else {})
    return tiny_server(
        data_fn(),
        model=model_factory,
        client=functools.partial(client_cls, **kwargs),
        strategy=strategy,
        executor=executor,
        num_rounds=rounds,
        clients_per_round=per_round,
        seed=7,
        logger=RunLogger(None, tensorboard=False, progress=False),
        stages=Stages(stragglers=stragglers),
    ).run()


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("model", ["mlr", "2nn", "cnn"])
def test_matches_serial_with_unequal_clients(model: str) -> None:
    serial, vmapped = run(SerialExecutor(), model), run(VmapExecutor(chunk_size=3), model)
    assert relative_error(vmapped.params, serial.params) <= model_tolerance(model)
    assert not torch.equal(vmapped.params, run(SerialExecutor(), model, rounds=2).params), (
        "training must move the weights"
    )
    sizes = {c["num_examples"] for r in serial.history for c in r["clients"]}
    assert len(sizes) > 1, "the federation should have clients of different sizes"


@pytest.mark.parametrize("model", ["mlr", "2nn", "cnn"])
def test_fedprox_with_stragglers_matches_serial(model: str) -> None:
    """FedProx's proximal term under vmap, with stragglers doing fewer epochs inside the same chunk."""
    stragglers = Stragglers(fraction=0.5, epochs=3, seed=7)
    serial = run(SerialExecutor(), model, FedProx(mu=0.5), stragglers=stragglers)
    vmapped = run(VmapExecutor(), model, FedProx(mu=0.5), stragglers=stragglers)
    error = relative_error(vmapped.params, serial.params)
    assert error <= model_tolerance(model)
    plain = run(VmapExecutor(), model, FedProx(mu=0.0), stragglers=stragglers)
    assert relative_error(plain.params, serial.params) > max(100 * error, 1e-6), "μ must change the result"


@pytest.mark.parametrize("model", ["mlr", "2nn", "cnn"])
def test_scaffold_matches_serial(model: str) -> None:
    """SCAFFOLD's correction (a model-sized vector per client) reaches the vectorised loss split by parameter."""
    serial, vmapped = run(SerialExecutor(), model, Scaffold()), run(VmapExecutor(), model, Scaffold())
    error = relative_error(vmapped.params, serial.params)
    assert error <= model_tolerance(model)
    assert relative_error(run(VmapExecutor(), model).params, serial.params) > max(100 * error, 1e-6), (
        "the correction must matter"
    )


@pytest.mark.parametrize(
    "optimizer",
    [
        functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, weight_decay=1e-3),
        functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, dampening=0.1, nesterov=False),
        functools.partial(torch.optim.SGD, lr=0.05, momentum=0.5, nesterov=True),
        functools.partial(torch.optim.Adam, lr=0.01, weight_decay=1e-3),
    ],
    ids=["sgd_momentum_wd", "sgd_dampening", "sgd_nesterov", "adam"],
)
def test_optimizers_match_serial(optimizer) -> None:
    serial, vmapped = run(SerialExecutor(), "2nn", optimizer=optimizer), run(VmapExecutor(), "2nn", optimizer=optimizer)
    assert relative_error(vmapped.params, serial.params) <= TOLERANCE


def fit_directly(executor, tasks: list[FitTask], optimizer=None) -> list:
    data = vector_data()
    factory = functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=16)
    kwargs = {"optimizer": optimizer} if optimizer else {}
    executor.start(
        Workload(factory, make_clients(data, functools.partial(Client, epochs=2, batch_size=8, **kwargs)), data.train)
    )
    torch.manual_seed(0)  # the same initial global weights for every executor
    try:
        return executor.fit(flatten(factory()), tasks)
    finally:
        executor.close()


@pytest.mark.parametrize(
    "optimizer",
    [
        None,
        functools.partial(torch.optim.SGD, lr=0.02, momentum=0.9, nesterov=True),
        functools.partial(torch.optim.Adam, lr=0.01),
    ],
    ids=["sgd", "nesterov", "adam"],
)
def test_client_updates_and_metrics_match_serial(optimizer) -> None:
    """Per-client: weights, example counts, steps, per-epoch losses, with epochs and batch sizes differing
    per client and one client with far more steps than the rest (its tail runs eagerly, continuing the
    vectorised optimizer's state)."""
    configs = [
        {},
        {"epochs": 1},
        {"batch_size": 5},
        {"epochs": 3, "batch_size": 16, "lr": 0.05},
        {"epochs": 9, "batch_size": 2},
    ]
    tasks = [FitTask(client_id=c, round_num=1, seed=100 + c, config=configs[c % 5]) for c in range(8)]
    serial = fit_directly(SerialExecutor(), tasks, optimizer)
    vmapped = fit_directly(VmapExecutor(chunk_size=5), tasks, optimizer)
    for s, v in zip(serial, vmapped, strict=True):
        assert (s.client_id, s.num_examples, s.metrics["local_steps"]) == (
            v.client_id,
            v.num_examples,
            v.metrics["local_steps"],
        )
        assert v.metrics["lr"] == pytest.approx(s.metrics["lr"], rel=1e-7)  # float32 in the stacked hyper-parameters
        # one round; the longest chain is the client with 9 epochs of batch size 2 (9 × ceil(38 / 2) steps)
        assert relative_error(v.params, s.params) <= tolerance(9 * 19, 60)
        assert v.epoch_losses == pytest.approx(s.epoch_losses, rel=1e-5) and len(v.epoch_losses) == len(s.epoch_losses)
        assert v.metrics["train_loss"] == pytest.approx(s.metrics["train_loss"], rel=1e-5)
        assert (v.worker, v.device) == ("vmap0", "cpu")
    assert len({v.metrics["local_steps"] for v in vmapped}) >= 3, "clients should do different numbers of steps"


def test_chunking_does_not_change_results_beyond_rounding() -> None:
    one_by_one = run(VmapExecutor(chunk_size=1), "2nn").params
    assert relative_error(run(VmapExecutor(chunk_size=128), "2nn").params, one_by_one) <= TOLERANCE


def test_several_devices_give_bitwise_the_same_result() -> None:
    """Chunks depend on the tasks only, so splitting them over devices (here CPU slots) changes nothing.
    8 clients per round in chunks of 3, 3, 2: vectorised steps, eager tails, and chunks on three threads."""
    one = run(VmapExecutor(devices="cpu", chunk_size=3), "2nn", per_round=8).params
    three = run(VmapExecutor(devices=["cpu", "cpu", "cpu"], chunk_size=3), "2nn", per_round=8).params
    assert torch.equal(one, three)


class ScaledLrClient(Client):
    """A client whose optimizer depends on its own id: the spec cache must not hand one client's lr to another."""

    def make_optimizer(self, model: nn.Module, config: dict) -> torch.optim.Optimizer:
        optimizer = super().make_optimizer(model, config)
        optimizer.param_groups[0]["lr"] *= 1 + self.client_id % 3
        return optimizer


def test_per_client_make_optimizer_is_honoured() -> None:
    shared = functools.partial(torch.optim.SGD, lr=0.01)  # one factory object for every client, as Hydra builds it
    serial = run(SerialExecutor(), "2nn", client_cls=ScaledLrClient, optimizer=shared)
    vmapped = run(
        VmapExecutor(), "2nn", client_cls=ScaledLrClient, optimizer=shared
    )  # one chunk of 4: vectorised steps first
    assert relative_error(vmapped.params, serial.params) <= TOLERANCE
    assert relative_error(vmapped.params, run(VmapExecutor(), "2nn", optimizer=shared).params) > 10 * TOLERANCE


class SmoothedClient(Client):
    """Another per-example loss: label-smoothed cross-entropy."""

    def per_example_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits, y, reduction="none", label_smoothing=0.2)


def test_custom_per_example_loss_matches_serial() -> None:
    serial = run(SerialExecutor(), "2nn", client_cls=SmoothedClient)
    vmapped = run(VmapExecutor(), "2nn", client_cls=SmoothedClient)
    assert relative_error(vmapped.params, serial.params) <= TOLERANCE
    assert relative_error(vmapped.params, run(VmapExecutor(), "2nn").params) > 10 * TOLERANCE


def test_a_raising_chunk_becomes_failures_with_traceback() -> None:
    data = vector_data()
    clients = make_clients(data, functools.partial(ExplodingClient, epochs=1, batch_size=8))
    factory = functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=16)
    executor = VmapExecutor(chunk_size=2)
    executor.start(Workload(factory, clients, data.train))
    ExplodingClient.armed = True
    try:
        tasks = [FitTask(client_id=c, round_num=0, seed=c) for c in (0, 1, 2)]
        results = executor.fit(flatten(factory()), tasks)
    finally:
        ExplodingClient.armed = False
    assert [r.client_id for r in results] == [0, 1, 2]
    assert all(isinstance(r, ClientFailure) for r in results)
    assert "ValueError: exploded" in results[0].error and "in a vmap chunk of clients" in results[0].error
    assert "per_example_loss" in results[0].traceback


class ExplodingClient(Client):
    armed = False

    def per_example_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if ExplodingClient.armed:
            raise ValueError("exploded")
        return super().per_example_loss(logits, y)


class BatchNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(60, 8), nn.BatchNorm1d(8), nn.Linear(8, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class DropoutNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(60, 8), nn.Dropout(0.5), nn.Linear(8, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class EagerOnlyTerm(LocalTraining):
    """A client half written for the eager loop only."""

    def loss_term(self, model: nn.Module) -> torch.Tensor | None:
        return sum(p.square().sum() for p in model.parameters())  # type: ignore[return-value]


class VectorTerm(LocalTraining):
    """Reads a vector from the config (like SCAFFOLD) in both forms."""

    def functional_term(self, params, anchor, numbers):  # noqa: ANN001, ANN201
        pieces = numbers.get("pull")
        return None if pieces is None else sum((p * pieces[name]).sum() for name, p in params.items())


def test_a_vector_that_is_not_model_sized_fails_the_chunk_with_a_clear_message() -> None:
    data = vector_data()
    factory = functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=8)
    executor = VmapExecutor()
    executor.start(Workload(factory, make_clients(data, Client), data.train, local=VectorTerm()))
    tasks = [
        FitTask(client_id=c, round_num=1, seed=c, config={"pull": np.zeros(5, dtype=np.float32)}) for c in range(3)
    ]
    results = executor.fit(flatten(factory()), tasks)
    assert all(isinstance(r, ClientFailure) for r in results)
    assert "config entry 'pull' has sizes [5] in one round" in results[0].error


class CustomLossClient(Client):
    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return super().loss(model, x, y) + 0.1 * sum(p.abs().sum() for p in model.parameters())


def start(model_factory=None, client_cls=Client, optimizer=None, local=None) -> None:
    data = vector_data()
    kwargs = {"optimizer": optimizer} if optimizer else {}
    clients = make_clients(data, functools.partial(client_cls, **kwargs))
    factory = model_factory or functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=8)
    VmapExecutor().start(Workload(factory, clients, data.train, local=local))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"model_factory": BatchNormNet},
            r"cannot train BatchNorm \(body.1: BatchNorm1d\); use GroupNorm .* or executor=process",
        ),
        ({"model_factory": DropoutNet}, r"draws random numbers \(e.g. dropout\); use executor=process"),
        (
            {"client_cls": CustomLossClient},
            r"CustomLossClient.loss \(a custom loss\).*override per_example_loss instead, or use executor=process",
        ),
        (
            {"optimizer": functools.partial(torch.optim.AdamW, lr=0.01)},
            r"SGD .* or Adam, not AdamW; use executor=process",
        ),
        (
            {"local": EagerOnlyTerm()},
            r"client half EagerOnlyTerm: it has no functional_term\(\) .*use executor=process",
        ),
    ],
    ids=["batchnorm", "dropout", "custom_loss", "adamw", "client_half_without_functional_term"],
)
def test_unsupported_workloads_are_refused_at_start(kwargs, message: str) -> None:
    with pytest.raises(VmapUnsupportedError, match=message):
        start(**kwargs)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match=r"executor.chunk_size must be >= 1 or null"):
        VmapExecutor(chunk_size=0)
    with pytest.raises(ValueError, match=r"executor.threads must be an integer >= 1 \(got 0\)"):
        VmapExecutor(threads=0)


def test_auto_chunk_size_follows_the_model_size() -> None:
    assert auto_chunk_size(7_850, "cpu") == 128  # MLR: every client of a typical round in one pass
    assert auto_chunk_size(199_210, "cpu") == 21  # 2NN: 64 MiB / (16 B x 199,210)
    assert auto_chunk_size(1_663_370, "cpu") == 8  # CNN: the floor
    assert auto_chunk_size(1_663_370, "cuda:0") == 128
    assert auto_chunk_size(1_663_370, "cuda:0", gpu_free_bytes=140 * 2**30) == 128  # 3.4 GB of state: fits
    assert auto_chunk_size(1_663_370, "cuda:0", gpu_free_bytes=2**30) == 10  # a quarter of 1 GiB / 26.6 MB
    assert auto_chunk_size(100_000_000, "cuda:0", gpu_free_bytes=2**30) == 1  # never 0


def test_executor_vmap_from_the_command_line(tmp_path: Path) -> None:
    """`executor=vmap` composes with Hydra and gives the serial run's model within tolerance."""
    overrides = ["num_rounds=2", "clients_per_round=5", "logger=quiet"]
    vmapped = run_config(compose([*overrides, "executor=vmap", "executor.chunk_size=4"]), tmp_path / "vmap")
    serial = run_config(compose([*overrides, "executor=serial"]), tmp_path / "serial")
    data = build_data(compose(overrides))  # the default: synthetic vectors of 60 features, 1 epoch of batch size 10
    steps_per_round = math.ceil(max(len(rows) for rows in data.client_train) / 10)
    assert relative_error(vmapped.params, serial.params) <= tolerance(2 * steps_per_round, 60)
    assert (tmp_path / "vmap" / "summary.json").exists()


def test_client_without_examples_returns_the_global_weights() -> None:
    data = vector_data()
    clients = make_clients(data, Client)
    clients[0].train_indices = np.zeros(0, dtype=np.int64)
    factory = functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=8)
    executor = VmapExecutor()
    executor.start(Workload(factory, clients, data.train))
    global_params = torch.randn(flatten(factory()).numel())
    results = executor.fit(global_params, [FitTask(client_id=c, round_num=0, seed=c) for c in (0, 1)])
    assert isinstance(results[0], ClientUpdate) and torch.equal(results[0].params, global_params)
    assert results[0].epoch_losses == (0.0,) and not torch.equal(results[1].params, global_params)
