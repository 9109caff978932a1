"""GPU placement (runs only where CUDA is available; skipped elsewhere)."""

from __future__ import annotations

import functools

import pytest
import torch

from fedsim.client import Client
from fedsim.data.federated import federate, make_clients
from fedsim.data.partition import natural
from fedsim.data.synthetic import synthetic
from fedsim.executor import ProcessExecutor, SerialExecutor
from fedsim.models import MLP2NN
from fedsim.server import Server
from fedsim.strategy import FedAvg

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _run(executor):  # type: ignore[no-untyped-def]
    data = federate(synthetic(num_devices=8, min_size=20, max_size=60, seed=3), natural, client_test_fraction=0.2, seed=0)
    server = Server(
        model_factory=functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=32),
        clients=make_clients(data, functools.partial(Client, batch_size=8)), train_data=data.train,
        test_data=data.test, strategy=FedAvg(), executor=executor, num_rounds=2, clients_per_round=8, seed=1,
    )
    return server.run()


@pytest.mark.parametrize("per_gpu", [1, 2, 4])
def test_workers_report_their_gpu(per_gpu: int) -> None:
    gpus = torch.cuda.device_count()
    result = _run(ProcessExecutor(devices="auto", workers_per_device=per_gpu))
    rows = [c for r in result.history for c in r["clients"]]
    assert {c["device"] for c in rows} <= {f"cuda:{i}" for i in range(gpus)}
    for row in rows:
        worker_index = int(row["worker"][1:])
        assert row["device"] == f"cuda:{worker_index % gpus}"


def test_gpu_process_matches_gpu_serial() -> None:
    serial = _run(SerialExecutor(device="cuda:0")).params
    process = _run(ProcessExecutor(devices=["cuda:0"], workers=2)).params
    assert torch.allclose(serial, process, atol=1e-5)
