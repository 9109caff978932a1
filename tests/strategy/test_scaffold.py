"""SCAFFOLD: known answers for both halves; the clients' control variates persist in client state; memory == disk."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from builders import tiny_server
from torch import nn

from fedsim.client.base import Client
from fedsim.core.params import ParamLayout
from fedsim.core.types import ClientUpdate
from fedsim.data.synthetic import synthetic
from fedsim.executor import ProcessExecutor, SerialExecutor
from fedsim.server.server import Server
from fedsim.strategy import ControlCorrection, FedAvg, Scaffold
from fedsim.strategy.context import RunContext
from fedsim.strategy.scaffold import STATE_KEY, correction


def _update(cid: int, params: list[float], steps: float = 1.0, lr: float = 1.0) -> ClientUpdate:
    return ClientUpdate(
        client_id=cid,
        round_num=1,
        params=torch.tensor(params),
        num_examples=1,
        metrics={"local_steps": steps, "lr": lr},
    )


def _client_round(
    s: Scaffold,
    round_num: int,
    cid: int,
    state: dict,
    x: torch.Tensor,
    y: list[float],
    steps: float = 1.0,
    lr: float = 1.0,
) -> ClientUpdate:
    """What a task of client ``cid`` does to its state (the client half's update_state), and its update."""
    update = _update(cid, y, steps, lr)
    ControlCorrection().update_state(state, s.client_config(round_num, cid), x, update)
    return update


def _context(num_clients: int) -> RunContext:
    return RunContext(
        layout=ParamLayout.of(nn.Linear(1, 1)),
        num_clients=num_clients,
        num_examples=(1,) * num_clients,
        clients_per_round=2,
        num_rounds=2,
        seed=0,
    )


def test_an_update_without_step_metrics_is_refused_before_any_state_changes() -> None:
    s = Scaffold()
    s.setup(_context(4))
    bare = ClientUpdate(client_id=3, round_num=1, params=torch.tensor([1.0, 1.0]), num_examples=1)
    with pytest.raises(ValueError, match=r"SCAFFOLD needs the metric 'local_steps' in every update"):
        s.aggregate(1, torch.zeros(2), [_update(1, [1.0, 0.0]), bare])
    assert s.control is None, "a refused round must leave the server control variate as it was"


def test_both_halves_known_answer_over_two_rounds() -> None:
    s = Scaffold()
    s.setup(_context(4))  # N = 4 clients in the federation
    x, states = torch.zeros(2), {1: {}, 2: {}, 3: {}}
    # c = c_i = 0; K·lr = 1:  c1+ = (x - y1) = (-1, 0), c2+ = (0, -2)
    updates = [_client_round(s, 1, 1, states[1], x, [1.0, 0.0]), _client_round(s, 1, 2, states[2], x, [0.0, 2.0])]
    x = s.aggregate(1, x, updates)
    assert torch.equal(x, torch.tensor([0.5, 1.0]))  # x + mean(y - x)
    assert torch.equal(states[1][STATE_KEY], torch.tensor([-1.0, 0.0]))
    assert torch.equal(states[2][STATE_KEY], torch.tensor([0.0, -2.0]))
    assert torch.equal(s.control, torch.tensor([-0.25, -0.5]))  # c + (1/N) Σ Δc_i
    # round 2: client 1 corrects by c - c1 = (0.75, -0.5); a new client 3 by c itself
    assert torch.equal(correction(s.client_config(2, 1), states[1]), torch.tensor([0.75, -0.5]))
    assert torch.equal(correction(s.client_config(2, 3), states[3]), torch.tensor([-0.25, -0.5]))
    # client 1 again, K=2, lr=0.5 (K·lr = 1): c1+ = c1 - c + (x - y) = (-1,0) - (-0.25,-0.5) + (0.5-1.5, 1-1)
    s.aggregate(2, x, [_client_round(s, 2, 1, states[1], x, [1.5, 1.0], steps=2, lr=0.5)])
    assert torch.allclose(states[1][STATE_KEY], torch.tensor([-1.75, 0.5]))
    assert torch.allclose(
        s.control, torch.tensor([-0.25, -0.5]) + (torch.tensor([-1.75, 0.5]) - torch.tensor([-1.0, 0.0])) / 4
    )
    assert states[3] == {}  # never trained, never touched


def test_client_half_corrects_the_gradient_by_c_minus_ci() -> None:
    model = nn.Linear(2, 1)
    correction = np.array([1.0, -2.0, 3.0], dtype=np.float32)  # state_dict order: weight (1x2), bias (1)
    half = ControlCorrection()
    half.begin_task(model, {"scaffold_control": correction}, {})  # c = correction, c_i = 0
    model.weight.grad = torch.tensor([[10.0, 20.0]])  # the bias has no gradient yet: it gets the correction alone
    half.before_step(model)
    assert torch.equal(model.weight.grad, torch.tensor([[11.0, 18.0]]))
    assert torch.equal(model.bias.grad, torch.tensor([3.0]))
    half.begin_task(model, {"scaffold_control": np.zeros(0, dtype=np.float32)}, {})
    half.before_step(model)  # first round: nothing to correct
    assert torch.equal(model.weight.grad, torch.tensor([[11.0, 18.0]]))


def test_client_half_trains_as_the_written_out_linear_term() -> None:
    """Client.fit with c − c_i added before each step equals autograd of ⟨c − c_i, w⟩ as a loss term, with
    momentum and a frozen layer (whose slice of the correction is ignored)."""

    class WrittenOut(ControlCorrection):
        def before_step(self, model: nn.Module) -> None:
            pass

        def loss_term(self, model: nn.Module) -> torch.Tensor | None:
            return sum((param * piece).sum() for param, piece in self.pieces)  # type: ignore[return-value]

    data = synthetic(num_devices=1, min_size=80, max_size=80, seed=2).train
    size = 60 * 16 + 16 + 16 * 10 + 10
    correction = np.random.default_rng(0).normal(scale=0.1, size=size).astype(np.float32)
    weights = []
    for half in (ControlCorrection(), WrittenOut()):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(60, 16), nn.Tanh(), nn.Linear(16, 10))
        model[0].bias.requires_grad_(False)
        client = Client(
            0, range(64), epochs=2, batch_size=8, optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)
        )
        update = client.fit(
            model,
            data,
            config={"scaffold_control": correction},
            state={},
            generator=torch.Generator().manual_seed(1),
            local=half,
        )
        weights.append(update.params)
    assert torch.allclose(weights[0], weights[1], rtol=1e-5, atol=1e-6)


def _run(strategy, executor, state_store: str = "memory") -> Server:  # type: ignore[no-untyped-def]
    server = tiny_server(
        client=functools.partial(Client, epochs=2, batch_size=8),
        strategy=strategy,
        executor=executor,
        num_rounds=4,
        seed=5,
        state_store=state_store,
    )
    server.run()
    return server


def test_client_states_persist_and_memory_equals_disk() -> None:
    memory, disk = _run(Scaffold(), SerialExecutor()), _run(Scaffold(), SerialExecutor(), state_store="disk")
    assert torch.equal(memory.params, disk.params)
    assert (
        memory.parts.client_states.clients() == disk.parts.client_states.clients()
        and len(memory.parts.client_states.clients()) >= 4
    )
    for cid in memory.parts.client_states.clients():  # every client that trained keeps its c_i, the same in both stores
        assert torch.equal(memory.parts.client_states.get(cid)[STATE_KEY], disk.parts.client_states.get(cid)[STATE_KEY])
    assert not torch.equal(memory.params, _run(FedAvg(), SerialExecutor()).params)  # the corrections matter


def test_scaffold_in_worker_processes_equals_serial() -> None:
    assert torch.equal(
        _run(Scaffold(), SerialExecutor()).params, _run(Scaffold(), ProcessExecutor(devices="cpu", workers=2)).params
    )


def test_bad_parameters_name_the_field() -> None:
    with pytest.raises(ValueError, match="strategy.server_lr"):
        Scaffold(server_lr=0)
