"""The one builder of a small real :class:`~fedsim.server.server.Server` that the tests share.

``tiny_federation(...)`` is FedProx's Synthetic(1, 1) cut small (``fedsim.data.synthetic``: a few devices of 20 to
60 examples, one client per device with the ``natural`` partition, a fraction of each client's rows for its local
test); ``tiny_server(...)`` puts a server around it, or around data of the test's own, with the settings the tests
vary, each defaulting to what most of them use. Every argument goes where its name says (the model factory, each
client's factory, :class:`~fedsim.server.settings.Federation`, :class:`~fedsim.server.settings.Schedule`, the
server's seed and its optional groups), so a test states what it changes and nothing is hidden.

A test whose builder is its subject (hand-made clients on hand-made data, a user's adapters, a script run in a fresh
interpreter) builds its ``Server`` itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
from torch import nn

from fedsim.client.base import Client
from fedsim.client.federation import FederatedData, federate, make_clients
from fedsim.data.partition import natural
from fedsim.data.synthetic import synthetic
from fedsim.executor import SerialExecutor
from fedsim.executor.base import Executor
from fedsim.models import LogisticRegression
from fedsim.observe.run_logger import RunLogger
from fedsim.server.server import Server
from fedsim.server.settings import Checkpoints, Evaluation, Federation, Schedule, Stages
from fedsim.strategy import FedAvg, Strategy


def sgd(lr: float) -> Callable[..., torch.optim.Optimizer]:
    """A client's optimizer: plain SGD at ``lr`` (``functools.partial(torch.optim.SGD, lr=lr)``)."""
    return functools.partial(torch.optim.SGD, lr=lr)


@functools.cache
def tiny_federation(
    num_devices: int = 8,
    *,
    num_features: int = 60,
    num_classes: int = 10,
    min_size: int = 20,
    max_size: int = 60,
    size_sigma_log: float = 2.0,
    seed: int = 3,
    client_test_fraction: float = 0.2,
) -> FederatedData:
    """``synthetic(...)`` with these arguments (its others at their defaults), one client per device (``natural``,
    partition seed 0), ``client_test_fraction`` of each client's rows for its local test. Cached: the same
    arguments give the same object, which a test must not change."""
    split = synthetic(
        num_devices=num_devices,
        num_features=num_features,
        num_classes=num_classes,
        min_size=min_size,
        max_size=max_size,
        size_sigma_log=size_sigma_log,
        seed=seed,
    )
    return federate(split, natural, client_test_fraction=client_test_fraction, seed=0)


def tiny_server(
    data: FederatedData | None = None,
    *,
    model: Callable[[], nn.Module] | None = None,
    client: Callable[..., Client] = Client,
    clients: Sequence[Client] | None = None,
    strategy: Strategy | None = None,
    executor: Executor | None = None,
    num_rounds: int = 3,
    clients_per_round: int = 4,
    min_success_fraction: float = 1.0,
    seed: int = 0,
    logger: RunLogger | None = None,
    evaluation: Evaluation | None = None,
    checkpoints: Checkpoints | None = None,
    stages: Stages | None = None,
    state_store: str = "memory",
    central_test: bool = True,
) -> Server:
    """A server on ``data`` (default ``tiny_federation()``): the model ``model`` (default logistic regression sized
    to the data), a client per share built by ``client`` (a client class, or a ``functools.partial`` of one with its
    settings; ``clients``: the test's own list or population instead), ``strategy`` (default FedAvg) on
    ``executor`` (default serial), ``num_rounds`` rounds of ``clients_per_round`` clients, the server's ``seed``.
    ``logger``, ``evaluation``, ``checkpoints`` and ``stages`` go to the server as given (``None``: its default);
    ``central_test=False`` leaves the server without central test data."""
    data = data if data is not None else tiny_federation()
    return Server(
        model_factory=model or functools.partial(LogisticRegression, data.train.input_shape, data.train.num_classes),
        federation=Federation(
            clients=clients if clients is not None else make_clients(data, client),
            train_data=data.train,
            test_data=data.test if central_test else None,
            state_store=state_store,
        ),
        strategy=strategy if strategy is not None else FedAvg(),
        executor=executor if executor is not None else SerialExecutor(),
        schedule=Schedule(
            num_rounds=num_rounds, clients_per_round=clients_per_round, min_success_fraction=min_success_fraction
        ),
        seed=seed,
        logger=logger,
        evaluation=evaluation,
        checkpoints=checkpoints,
        stages=stages,
    )
