"""The small run the process and Ray executor tests share: one federation (8 Synthetic clients), one run of it under
any executor, the serial reference it must equal bitwise, and the worker pids a run's logs name."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import torch
from builders import tiny_federation, tiny_server

from fedsim.client.base import Client
from fedsim.executor import SerialExecutor
from fedsim.models import MLP2NN
from fedsim.observe.run_logger import RunLogger
from fedsim.server.server import RunResult
from fedsim.strategy import FedAvg

ROUNDS, PER_ROUND = 3, 4


def federation_data():  # noqa: ANN201
    return tiny_federation(8, size_sigma_log=0.5)


def run(executor, client_cls=Client, run_dir=None, min_success_fraction=1.0, **client_kwargs) -> RunResult:
    return tiny_server(
        federation_data(),
        model=functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=32),
        client=functools.partial(client_cls, epochs=2, batch_size=8, **client_kwargs),
        executor=executor,
        num_rounds=ROUNDS,
        clients_per_round=PER_ROUND,
        min_success_fraction=min_success_fraction,
        seed=7,
        logger=RunLogger(run_dir, tensorboard=run_dir is not None, progress=False),
    ).run()


@functools.lru_cache(maxsize=1)
def serial_reference() -> torch.Tensor:
    return run(SerialExecutor()).params


def worker_pids(run_dir: Path) -> set[int]:
    text = "".join(p.read_text() for p in (run_dir / "workers").glob("*.log"))
    return {int(pid) for pid in re.findall(r"\(pid (\d+),", text)}


def assert_all_gone(pids: set[int]) -> None:
    assert pids, "no worker pid was recorded"
    alive = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
    assert not alive, f"worker processes left behind: {alive}"


def first_sampled_client() -> int:
    from fedsim.core.seeding import sampling_rng

    return FedAvg().sample(1, federation_data().num_clients, PER_ROUND, sampling_rng(7, 1))[0]
