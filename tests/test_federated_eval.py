"""Federated evaluation on the sampled clients' local test splits."""

from __future__ import annotations

import functools

import pytest
import torch

from fedsim.client import Client, evaluate_indices
from fedsim.data.federated import federate, make_clients
from fedsim.data.partition import natural
from fedsim.data.synthetic import synthetic
from fedsim.executor import SerialExecutor
from fedsim.models import LogisticRegression
from fedsim.server import Server
from fedsim.strategy import FedAvg


def _server(client_test_fraction: float) -> Server:
    data = federate(synthetic(num_devices=6, min_size=20, max_size=40, seed=2), natural,
                    client_test_fraction=client_test_fraction, seed=0)
    return Server(
        model_factory=functools.partial(LogisticRegression, (60,), 10), clients=make_clients(data, Client),
        train_data=data.train, test_data=data.test, strategy=FedAvg(), executor=SerialExecutor(),
        num_rounds=2, clients_per_round=3, seed=0,
    )


def test_client_metrics_are_the_example_weighted_mean_over_sampled_clients() -> None:
    server = _server(0.25)
    server.run()
    sampled = [0, 2, 5]
    expected_correct = expected_n = 0.0
    for cid in sampled:
        result = evaluate_indices(server.model, server.train_data, torch.from_numpy(server.clients[cid].test_indices))
        expected_correct += result["accuracy"] * result["num_examples"]
        expected_n += result["num_examples"]
    assert expected_n > 0
    assert server.evaluate_clients(sampled)["eval/client_accuracy"] == pytest.approx(expected_correct / expected_n)


def test_no_client_metrics_without_local_test_data() -> None:
    result = _server(0.0).run()
    assert all("eval/client_accuracy" not in r for r in result.history)
    assert "eval/client_accuracy" in _server(0.25).run().history[-1]
