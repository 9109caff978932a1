"""FedProx (both halves) and simulated stragglers."""

from __future__ import annotations

import functools

import pytest
import torch
from builders import tiny_server
from torch import nn

from fedsim.client.base import Client
from fedsim.core.types import ClientUpdate
from fedsim.data.synthetic import synthetic
from fedsim.executor import ProcessExecutor, SerialExecutor
from fedsim.server.server import Server
from fedsim.server.settings import Stages
from fedsim.server.stragglers import Stragglers
from fedsim.strategy import FedAvg, FedProx, ProximalTerm


def test_proximal_term_known_answer_and_gradient() -> None:
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
        model.bias.copy_(torch.tensor([0.5]))
    term = ProximalTerm()
    term.begin(model, {"prox_mu": 2.0})
    term.before_step(model)  # at the anchor, no gradients yet: zeros appear, nothing is added
    assert torch.equal(model.weight.grad, torch.zeros(1, 2)) and torch.equal(model.bias.grad, torch.zeros(1))
    with torch.no_grad():
        model.weight.add_(torch.tensor([[1.0, -2.0]]))  # w - w_g = (1, -2), bias unchanged
    model.weight.grad = torch.tensor([[10.0, 20.0]])
    term.before_step(model)
    assert torch.equal(model.weight.grad, torch.tensor([[12.0, 16.0]]))  # + mu * d
    assert torch.equal(model.bias.grad, torch.zeros(1))


class WrittenOutProximal(ProximalTerm):
    """μ/2 Σ ‖p − a‖² written out as a loss term, for autograd to differentiate (the reference)."""

    def before_step(self, model: nn.Module) -> None:
        pass

    def loss_term(self, model: nn.Module) -> torch.Tensor | None:
        trained = [p for p in model.parameters() if p.requires_grad]
        return 0.5 * self.mu * sum(((p - a) ** 2).sum() for p, a in zip(trained, self.anchor, strict=True))  # type: ignore[return-value]


class OwnStep(Client):
    """A client with its own train_step (gradient clipping), as docs/writing-a-strategy.md allows."""

    def train_step(self, model, optimizer, x, y):  # type: ignore[no-untyped-def]
        optimizer.zero_grad(set_to_none=True)
        loss = self.objective(model, x, y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 100.0)
        optimizer.step()
        return float(loss.detach())


@pytest.mark.parametrize("client_class", [Client, OwnStep])
def test_proximal_term_trains_as_the_written_out_loss_term(client_class: type[Client]) -> None:
    """Client.fit with the gradient added before each step equals autograd of the written-out term, on a
    deep model with momentum, a frozen layer and (OwnStep) an overridden train_step; the reported loss
    is the data loss alone."""
    data = synthetic(num_devices=1, min_size=80, max_size=80, seed=2).train
    weights, losses = [], []
    for local in (ProximalTerm(), WrittenOutProximal(), None):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(60, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 10))
        model[2].weight.requires_grad_(False)
        client = client_class(
            0, range(64), epochs=3, batch_size=8, optimizer=functools.partial(torch.optim.SGD, lr=0.5, momentum=0.9)
        )
        update = client.fit(
            model, data, config={"prox_mu": 0.5}, generator=torch.Generator().manual_seed(1), local=local
        )
        weights.append(update.params)
        losses.append(update.epoch_losses)
    fast, written, plain = weights
    assert torch.allclose(fast, written, rtol=1e-5, atol=1e-6)
    assert (fast - plain).norm() > 100 * (fast - written).norm()  # the term really changes training
    assert losses[0][0] < losses[1][0]  # the written-out loss term's value is reported; the fast term's is not


def test_proximal_term_is_off_when_mu_is_zero() -> None:
    model = nn.Linear(2, 1)
    term = ProximalTerm()
    term.begin(model, {})
    with torch.no_grad():
        model.weight.add_(1.0)
    model.weight.grad, model.bias.grad = torch.ones(1, 2), torch.ones(1)
    term.before_step(model)
    assert torch.equal(model.weight.grad, torch.ones(1, 2)) and torch.equal(model.bias.grad, torch.ones(1))


def test_server_half_known_answer_keeps_every_update() -> None:
    # n = 1, 3, 4 (total 8), a straggler's few examples included:  x = (1 + 9 - 8) / 8,  y = (2 + 18 + 0) / 8.
    # The global weights and μ do not enter the server half.
    updates = [
        ClientUpdate(0, 1, torch.tensor([1.0, 2.0]), 1),
        ClientUpdate(2, 1, torch.tensor([3.0, 6.0]), 3),
        ClientUpdate(5, 1, torch.tensor([-2.0, 0.0]), 4),
    ]
    for strategy, x in ((FedProx(mu=5.0), torch.zeros(2)), (FedProx(mu=0.0), torch.tensor([9.0, -9.0]))):
        assert torch.equal(strategy.aggregate(1, x, updates), torch.tensor([0.25, 2.5]))


def test_server_half_sends_mu_in_a_fresh_dict_and_rejects_negative_mu() -> None:
    strategy = FedProx(mu=0.5)
    first = strategy.client_config(1, 3)
    assert first == {"prox_mu": 0.5} and isinstance(strategy.local_training(), ProximalTerm)
    first["prox_mu"] = 99.0
    assert strategy.client_config(2, 3) == {"prox_mu": 0.5}
    assert FedProx.keeps_stragglers and not FedAvg.keeps_stragglers
    with pytest.raises(ValueError, match=r"^strategy\.mu must be a finite number >= 0 \(got -0\.1\)$"):
        FedProx(mu=-0.1)


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
    with pytest.raises(ValueError, match="stragglers."):
        Stragglers(**{"fraction": 0.5, "epochs": 2, **bad})


def _server(strategy, executor, stragglers=None, clients=None) -> Server:  # type: ignore[no-untyped-def]
    return tiny_server(
        client=functools.partial(Client, epochs=3, batch_size=8),
        clients=clients,
        strategy=strategy,
        executor=executor,
        seed=5,
        stages=Stages(stragglers=stragglers),
    )


def _run(strategy, executor, stragglers=None) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return _server(strategy, executor, stragglers).run().params


class RecordingFedAvg(FedAvg):
    """FedAvg that records which clients reached aggregate."""

    def __init__(self) -> None:
        self.seen: dict[int, list[int]] = {}

    def aggregate(self, round_num, global_params, updates):  # type: ignore[no-untyped-def]
        self.seen[round_num] = [u.client_id for u in updates]
        return super().aggregate(round_num, global_params, updates)


def test_server_tells_stragglers_to_do_fewer_epochs_and_fedavg_drops_them() -> None:
    stragglers = Stragglers(fraction=0.5, epochs=3, seed=5)
    strategy = RecordingFedAvg()
    server = _server(strategy, SerialExecutor(), stragglers)
    result = server.run()
    rows = {(r["round"], c["client_id"]): c for r in result.history for c in r["clients"]}
    slow = {(rnd, cid) for rnd, cid in rows if stragglers.epochs_for(rnd, cid) is not None}
    assert slow and len(slow) < len(rows)
    for rnd, cid in rows:
        expected = stragglers.epochs_for(rnd, cid) or 3
        assert len(rows[rnd, cid]["epoch_losses"]) == expected
    for rnd, seen in strategy.seen.items():
        assert all((rnd, cid) not in slow for cid in seen)
    assert sum(r["client/num_aggregated"] for r in result.history) == len(rows) - len(slow)


def test_fedprox_keeps_stragglers() -> None:
    result = _server(FedProx(mu=1.0), SerialExecutor(), Stragglers(fraction=0.5, epochs=3, seed=5)).run()
    assert all(r["client/num_aggregated"] == 4 for r in result.history)


def test_a_round_of_only_dropped_stragglers_keeps_the_model() -> None:
    server = _server(FedAvg(), SerialExecutor(), Stragglers(fraction=1.0, epochs=3))
    initial = server.params.clone()
    assert torch.equal(server.run().params, initial)


def test_fedprox_with_mu_zero_equals_fedavg() -> None:
    assert torch.equal(_run(FedProx(mu=0.0), SerialExecutor()), _run(FedAvg(), SerialExecutor()))


def test_fedprox_changes_training_and_is_bitwise_equal_in_worker_processes() -> None:
    stragglers = Stragglers(fraction=0.5, epochs=3)
    serial = _run(FedProx(mu=1.0), SerialExecutor(), stragglers)
    assert not torch.equal(serial, _run(FedAvg(), SerialExecutor()))
    parallel = _run(FedProx(mu=1.0), ProcessExecutor(devices="cpu", workers=2), stragglers)
    assert torch.equal(serial, parallel)
