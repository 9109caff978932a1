"""FedProx (both halves) and simulated stragglers."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from fedsim.client import Client
from fedsim.data.federated import federate, make_clients
from fedsim.data.partition import natural
from fedsim.data.synthetic import synthetic
from fedsim.executor import ProcessExecutor, SerialExecutor
from fedsim.models import LogisticRegression
from fedsim.server import Server
from fedsim.strategy import FedAvg, FedProx, ProximalTerm
from fedsim.strategy.functional import weighted_average
from fedsim.strategy.stragglers import Stragglers
from fedsim.types import ClientUpdate


def test_proximal_term_known_answer_and_gradient() -> None:
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
        model.bias.copy_(torch.tensor([0.5]))
    term = ProximalTerm()
    term.begin(model, {"prox_mu": 2.0})
    assert float(term.loss_term(model).detach()) == 0.0  # at the anchor
    with torch.no_grad():
        model.weight.add_(torch.tensor([[1.0, -2.0]]))  # w - w_g = (1, -2), bias unchanged
    value = term.loss_term(model)
    assert float(value) == pytest.approx(0.5 * 2.0 * (1.0 + 4.0))  # mu/2 * ||d||^2 = 5
    value.backward()
    assert torch.equal(model.weight.grad, torch.tensor([[2.0, -4.0]]))  # mu * d


def test_proximal_term_is_off_when_mu_is_zero() -> None:
    term = ProximalTerm()
    term.begin(nn.Linear(2, 1), {})
    assert term.loss_term(nn.Linear(2, 1)) is None


def test_stragglers_are_a_pure_function_of_seed_round_client() -> None:
    s = Stragglers(fraction=0.9, epochs=5, seed=3)
    draws = [s.epochs_for(r, c) for r in range(1, 101) for c in range(100)]
    assert draws == [Stragglers(0.9, 5, 3).epochs_for(r, c) for r in range(1, 101) for c in range(100)]
    assert draws != [Stragglers(0.9, 5, 4).epochs_for(r, c) for r in range(1, 101) for c in range(100)]
    straggling = [d for d in draws if d is not None]
    assert abs(len(straggling) / len(draws) - 0.9) < 0.02
    assert set(straggling) == {1, 2, 3, 4}
    assert all(Stragglers(0.0, 5).epochs_for(1, c) is None for c in range(50))
    assert all(Stragglers(1.0, 1).epochs_for(1, c) is None for c in range(50))  # E=1: nothing to cut


@pytest.mark.parametrize("bad", [{"fraction": -0.1}, {"fraction": 1.5}, {"epochs": 0}])
def test_straggler_parameters_are_checked(bad: dict) -> None:
    with pytest.raises(ValueError, match="strategy."):
        Stragglers(**{"fraction": 0.5, "epochs": 2, **bad})


def _updates(n: int) -> list[ClientUpdate]:
    return [ClientUpdate(client_id=i, round_num=1, params=torch.full((3,), float(i)), num_examples=i + 1) for i in range(n)]


def test_fedavg_drops_stragglers_and_fedprox_keeps_them() -> None:
    updates = _updates(10)
    fedavg = FedAvg(straggler_fraction=0.5, local_epochs=3, seed=0)
    slow = {u.client_id for u in updates if fedavg.stragglers.epochs_for(1, u.client_id) is not None}
    assert 0 < len(slow) < 10
    assert all(fedavg.client_config(1, c)["epochs"] in (1, 2) for c in slow)
    kept = [u for u in updates if u.client_id not in slow]
    expected = weighted_average([u.params for u in kept], [u.num_examples for u in kept])
    assert torch.equal(fedavg.aggregate(1, torch.zeros(3), updates), expected)
    fedprox = FedProx(mu=1.0, straggler_fraction=0.5, local_epochs=3, seed=0)
    assert fedprox.client_config(1, min(slow))["prox_mu"] == 1.0
    everyone = weighted_average([u.params for u in updates], [u.num_examples for u in updates])
    assert torch.equal(fedprox.aggregate(1, torch.zeros(3), updates), everyone)


def test_fedavg_keeps_the_model_when_everyone_straggles() -> None:
    fedavg = FedAvg(straggler_fraction=1.0, local_epochs=3)
    global_params = torch.tensor([7.0, 8.0, 9.0])
    assert torch.equal(fedavg.aggregate(1, global_params, _updates(4)), global_params)


def _run(strategy, executor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    data = federate(synthetic(num_devices=8, min_size=20, max_size=60, seed=3), natural, client_test_fraction=0.2, seed=0)
    server = Server(
        model_factory=functools.partial(LogisticRegression, (60,), 10),
        clients=make_clients(data, functools.partial(Client, epochs=3, batch_size=8)), train_data=data.train,
        test_data=data.test, strategy=strategy, executor=executor, num_rounds=3, clients_per_round=4, seed=5,
    )
    return server.run().params


def test_fedprox_with_mu_zero_equals_fedavg() -> None:
    assert torch.equal(_run(FedProx(mu=0.0), SerialExecutor()), _run(FedAvg(), SerialExecutor()))


def test_fedprox_changes_training_and_is_bitwise_equal_in_worker_processes() -> None:
    serial = _run(FedProx(mu=1.0, straggler_fraction=0.5, local_epochs=3), SerialExecutor())
    assert not torch.equal(serial, _run(FedAvg(), SerialExecutor()))
    parallel = _run(FedProx(mu=1.0, straggler_fraction=0.5, local_epochs=3), ProcessExecutor(devices="cpu", workers=2))
    assert torch.equal(serial, parallel)
