"""A small server for the secure-aggregation tests: twelve Synthetic devices of 50 examples each (so FedAvg's example
weights are equal and its mean is the uniform one secure aggregation computes), four clients a round."""

from __future__ import annotations

import functools
from typing import Any

import torch

from fedsim.client.base import Client
from fedsim.client.federation import FederatedData, federate, make_clients
from fedsim.data.partition import natural
from fedsim.data.synthetic import synthetic
from fedsim.executor import SerialExecutor
from fedsim.models import LogisticRegression
from fedsim.server import RoundStage, Server
from fedsim.server.settings import Federation, Schedule, Stages
from fedsim.strategy import FedAvg


@functools.cache
def equal_data() -> FederatedData:
    """Twelve devices of 50 examples (40 to train on each)."""
    return federate(
        synthetic(num_devices=12, num_features=10, num_classes=5, min_size=50, max_size=50, seed=3),
        natural,
        client_test_fraction=0.2,
        seed=0,
    )


def server(*extra: RoundStage, executor: Any = None, rounds: int = 3) -> Server:
    """FedAvg over :func:`equal_data`, 4 clients a round, with ``extra`` stages."""
    data = equal_data()
    factory = functools.partial(Client, epochs=2, batch_size=10, optimizer=functools.partial(torch.optim.SGD, lr=0.1))
    return Server(
        model_factory=functools.partial(LogisticRegression, data.train.input_shape, data.train.num_classes),
        federation=Federation(make_clients(data, factory), data.train, data.test),
        strategy=FedAvg(),
        executor=executor or SerialExecutor(),
        schedule=Schedule(num_rounds=rounds, clients_per_round=4),
        seed=1,
        stages=Stages(extra=list(extra)),
    )
