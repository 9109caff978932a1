"""GPU placement and the executors' CUDA paths (runs only where CUDA is available; skipped elsewhere)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import pytest
import torch
from builders import tiny_server
from torch import nn

from fedsim.client.base import Client
from fedsim.executor import Executor, ProcessExecutor, SerialExecutor, VmapExecutor
from fedsim.models import MLP2NN, LogisticRegression
from fedsim.server.server import RunResult
from fedsim.server.settings import Evaluation
from fedsim.strategy import FedProx, Scaffold, Strategy

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TOLERANCE = 1e-5  # vmap vs serial: relative error of the final weights (as in test_vmap.py, on CPU)
MODELS: dict[str, Callable[[], nn.Module]] = {
    "mlr": functools.partial(LogisticRegression, input_shape=(60,), num_classes=10),
    "2nn": functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=32),
}


def _run(
    executor: Executor, model: str = "2nn", optimizer: Callable | None = None, strategy: Strategy | None = None
) -> RunResult:
    """2 rounds of 8 Synthetic(1,1) clients of unequal sizes (2 to 6 local steps of batch 8)."""
    client = functools.partial(Client, batch_size=8, **({"optimizer": optimizer} if optimizer else {}))
    server = tiny_server(
        model=MODELS[model],
        client=client,
        strategy=strategy,
        executor=executor,
        num_rounds=2,
        clients_per_round=8,
        seed=1,
    )
    return server.run()


def _rows(result: RunResult) -> list[dict]:
    return [c for r in result.history for c in r["clients"]]


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.fixture
def full_fp32() -> Iterator[None]:
    """Plain fp32 matmuls (no TF32) for the comparisons, whatever the environment set (these models have no
    convolutions, so cuDNN's own TF32 switch does not matter)."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


@pytest.mark.parametrize("per_gpu", [1, 2, 4])
def test_workers_report_their_gpu(per_gpu: int) -> None:
    gpus = torch.cuda.device_count()
    result = _run(ProcessExecutor(devices="auto", workers_per_device=per_gpu))
    rows = _rows(result)
    assert {c["device"] for c in rows} <= {f"cuda:{i}" for i in range(gpus)}
    for row in rows:
        worker_index = int(row["worker"][1:])
        assert row["device"] == f"cuda:{worker_index % gpus}"


def test_gpu_process_matches_gpu_serial() -> None:
    serial = _run(SerialExecutor(device="cuda:0")).params
    process = _run(ProcessExecutor(devices=["cuda:0"], workers=2)).params
    assert torch.allclose(serial, process, atol=1e-5)


def test_bare_cuda_device_name_reaches_the_workers() -> None:
    """``devices="cuda"`` (no index, as a config may say it) means the current GPU, as it does for ``.to("cuda")``."""
    rows = _rows(_run(ProcessExecutor(devices="cuda", workers=1)))
    assert rows and all(row["device"] == "cuda:0" for row in rows)


@pytest.mark.parametrize("chunk_size", [None, 3], ids=["auto_chunk", "chunk3"])
@pytest.mark.parametrize("model", ["mlr", "2nn"])
def test_gpu_vmap_matches_gpu_serial(model: str, chunk_size: int | None, full_fp32: None) -> None:
    """The vmap executor on cuda:0 against the serial executor on cuda:0. ``chunk_size=None`` is the GPU's
    automatic size (all 8 clients in one vectorised pass); 3 gives chunks of 3, 3 and 2 clients, so
    vectorised steps, eager tails that continue them, and a chunk trained eagerly from its first step."""
    serial = _run(SerialExecutor(device="cuda:0"), model)
    vmapped = _run(VmapExecutor(devices=["cuda:0"], chunk_size=chunk_size), model)
    assert _relative_error(vmapped.params, serial.params) <= TOLERANCE
    assert _rows(vmapped) and all(row["device"] == "cuda:0" for row in _rows(vmapped))
    assert all(row["device"] == "cuda:0" for row in _rows(serial))
    assert {row["worker"] for row in _rows(vmapped)} == {"vmap0"}


@pytest.mark.parametrize(
    "optimizer",
    [
        functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, nesterov=True),
        functools.partial(torch.optim.Adam, lr=0.01),
    ],
    ids=["sgd_nesterov", "adam"],
)
def test_gpu_vmap_optimizer_state_matches_gpu_serial(optimizer: Callable, full_fp32: None) -> None:
    """Stacked optimizer state on the GPU, handed to a torch.optim optimizer for the eager tail (chunks of 3)."""
    serial = _run(SerialExecutor(device="cuda:0"), "2nn", optimizer=optimizer)
    vmapped = _run(VmapExecutor(devices=["cuda:0"], chunk_size=3), "2nn", optimizer=optimizer)
    assert _relative_error(vmapped.params, serial.params) <= TOLERANCE


@pytest.mark.parametrize("flag", ["fused", "capturable"])
def test_gpu_vmap_fused_or_capturable_adam_matches_gpu_serial(flag: str, full_fp32: None) -> None:
    """Adam with its state on the GPU (``step`` included): the eager tail must hand it a GPU step tensor."""
    optimizer = functools.partial(torch.optim.Adam, lr=0.01, **{flag: True})
    serial = _run(SerialExecutor(device="cuda:0"), "2nn", optimizer=optimizer)
    vmapped = _run(VmapExecutor(devices=["cuda:0"], chunk_size=3), "2nn", optimizer=optimizer)
    assert _relative_error(vmapped.params, serial.params) <= TOLERANCE


@pytest.mark.parametrize("strategy", [functools.partial(FedProx, mu=0.5), Scaffold], ids=["fedprox", "scaffold"])
def test_gpu_vmap_strategy_terms_match_gpu_serial(strategy: Callable[[], Strategy], full_fp32: None) -> None:
    """Per-client config numbers (FedProx's μ) and model-sized vectors (SCAFFOLD's correction) on the GPU."""
    serial = _run(SerialExecutor(device="cuda:0"), "2nn", strategy=strategy())
    vmapped = _run(VmapExecutor(devices=["cuda:0"], chunk_size=3), "2nn", strategy=strategy())
    assert _relative_error(vmapped.params, serial.params) <= TOLERANCE


def test_server_evaluates_on_the_gpu_with_the_cpus_answers(full_fp32: None) -> None:
    """eval_device=cuda:0 (what auto picks here) changes no weight and metrics only in the last bits."""

    def run(device: str) -> RunResult:
        client = functools.partial(Client, batch_size=8)
        evaluation = Evaluation(device=device)
        return tiny_server(
            model=MODELS["2nn"], client=client, num_rounds=2, clients_per_round=8, seed=1, evaluation=evaluation
        ).run()

    on_gpu, on_cpu = run("cuda:0"), run("cpu")
    assert torch.equal(on_gpu.params, on_cpu.params) and next(on_gpu.model.parameters()).device.type == "cpu"
    for g, c in zip(on_gpu.history, on_cpu.history, strict=True):
        for key in ("eval/loss", "eval/accuracy", "eval_global/loss", "eval_global/accuracy"):
            assert g[key] == pytest.approx(c[key], rel=1e-5), key
