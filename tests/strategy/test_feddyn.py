"""FedDyn: known answers for both halves; h and the clients' g_k carry over rounds, checkpoints and executors."""

from __future__ import annotations

import functools
import io
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from builders import tiny_federation, tiny_server
from torch import nn

from fedsim.client.base import Client
from fedsim.client.federation import FederatedData
from fedsim.core.params import ParamLayout
from fedsim.core.types import ClientUpdate
from fedsim.data.synthetic import synthetic
from fedsim.executor import ProcessExecutor, SerialExecutor, VmapExecutor
from fedsim.observe.run_logger import RunLogger
from fedsim.server.server import Server
from fedsim.server.settings import Checkpoints
from fedsim.strategy import FedAvg
from fedsim.strategy.context import RunContext
from fedsim.strategy.feddyn import ALPHA_KEY, SIZE_KEY, STATE_KEY, DynamicRegulariser, FedDyn


def _context(num_clients: int, model: nn.Module | None = None) -> RunContext:
    layout = ParamLayout.of(model or nn.Linear(1, 1))  # 2 weights: the flat vectors below
    return RunContext(
        layout=layout,
        num_clients=num_clients,
        num_examples=(1,) * num_clients,
        clients_per_round=2,
        num_rounds=2,
        seed=0,
    )


def _client_round(
    s: FedDyn, round_num: int, cid: int, state: dict, theta: torch.Tensor, trained: list[float], n: int = 1
) -> ClientUpdate:
    """What a task of client ``cid`` does to its state (the client half's update_state), and its update."""
    update = ClientUpdate(client_id=cid, round_num=round_num, params=torch.tensor(trained), num_examples=n)
    DynamicRegulariser().update_state(state, s.client_config(round_num, cid), theta, update)
    return update


def _two_rounds(s: FedDyn, states: dict[int, dict]) -> list[torch.Tensor]:
    """Round 1: clients 1 and 2 from θ⁰ = 0; round 2: clients 1 and 3 (new) from θ¹. Every Δ_k is (1, 0) or (0, 2)."""
    theta0 = torch.zeros(2)
    theta1 = s.aggregate(
        1,
        theta0,
        [
            _client_round(s, 1, 1, states[1], theta0, [1.0, 0.0], n=1),
            _client_round(s, 1, 2, states[2], theta0, [0.0, 2.0], n=100),
        ],
    )
    theta2 = s.aggregate(
        2,
        theta1,
        [
            _client_round(s, 2, 1, states[1], theta1, [1.75, 1.5]),
            _client_round(s, 2, 3, states[3], theta1, [0.75, 3.5]),
        ],
    )
    return [theta1, theta2]


def test_both_halves_known_answer_over_two_rounds() -> None:
    s = FedDyn(alpha=0.5)
    s.setup(_context(4))  # m = 4 clients in the federation
    states: dict[int, dict] = {1: {}, 2: {}, 3: {}}
    assert s.client_config(1, 1) == {ALPHA_KEY: 0.5, SIZE_KEY: 0}  # no client holds g_k yet
    theta1, theta2 = _two_rounds(s, states)
    # round 1: Σ Δ = (1, 2);  h = 0 − (α/m)(1, 2) = (−0.125, −0.25)
    #          θ¹ = mean(θ_k) − h/α = (0.5, 1) + (0.25, 0.5) = (0.75, 1.5)
    #          (uniform: client 2's 100 examples count once)
    #          g_1 = −α Δ_1 = (−0.5, 0),  g_2 = (0, −1)
    assert torch.equal(theta1, torch.tensor([0.75, 1.5]))
    assert torch.equal(states[2][STATE_KEY], torch.tensor([0.0, -1.0]))
    # round 2: Δ_1 = (1, 0), Δ_3 = (0, 2);  h = (−0.125, −0.25) − 0.125 (1, 2) = (−0.25, −0.5)
    #          θ² = (1.25, 2.5) + (0.5, 1) = (1.75, 3.5);  g_1 = (−0.5, 0) − 0.5 (1, 0) = (−1, 0);  g_3 = (0, −1)
    assert torch.equal(theta2, torch.tensor([1.75, 3.5]))
    assert torch.equal(s.h, torch.tensor([-0.25, -0.5]))
    assert torch.equal(states[1][STATE_KEY], torch.tensor([-1.0, 0.0]))
    assert torch.equal(states[3][STATE_KEY], torch.tensor([0.0, -1.0]))
    assert torch.equal(states[2][STATE_KEY], torch.tensor([0.0, -1.0]))  # not sampled: unchanged
    assert s.client_config(3, 2) == {ALPHA_KEY: 0.5, SIZE_KEY: 2}  # from now on vmap stacks full-size g_k


def test_state_dict_round_trip_through_a_checkpoint_continues_exactly() -> None:
    s = FedDyn(alpha=0.5)
    s.setup(_context(4))
    assert s.state_dict() == {"h": None}
    theta0, states = torch.zeros(2), {1: {}, 2: {}}
    theta1 = s.aggregate(1, theta0, [_client_round(s, 1, 1, states[1], theta0, [1.0, 0.0])])
    buffer = io.BytesIO()
    torch.save(s.state_dict(), buffer)
    resumed = FedDyn(alpha=0.5)
    resumed.setup(_context(4))
    resumed.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    assert torch.equal(resumed.h, s.h) and resumed.client_config(2, 2) == s.client_config(2, 2)
    second = [ClientUpdate(client_id=2, round_num=2, params=torch.tensor([0.3, -0.7]), num_examples=1)]
    assert torch.equal(resumed.aggregate(2, theta1, second), s.aggregate(2, theta1, second))
    assert torch.equal(resumed.h, s.h)


def test_float_buffers_are_averaged_without_h() -> None:
    # nn.BatchNorm1d(1): weight, bias (trained), running_mean, running_var (float buffers) → 4 weights.
    # One client of m = 2, α = 1, Δ = (1, 1, 1, 1): h = −(1/2) Δ on the parameters only = (−0.5, −0.5, 0, 0);
    # θ¹ = θ⁰ + Δ − h = (1.5, 1.5, 1, 1)
    s = FedDyn(alpha=1.0)
    s.setup(_context(2, nn.BatchNorm1d(1)))
    update = ClientUpdate(client_id=0, round_num=1, params=torch.ones(4), num_examples=1)
    assert torch.equal(s.aggregate(1, torch.zeros(4), [update]), torch.tensor([1.5, 1.5, 1.0, 1.0]))
    assert torch.equal(s.h, torch.tensor([-0.5, -0.5, 0.0, 0.0]))


def _linear(weight: list[float], bias: float) -> nn.Linear:
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([weight]))
        model.bias.copy_(torch.tensor([bias]))
    return model


def test_client_half_adds_minus_g_plus_alpha_times_the_distance() -> None:
    model = _linear([1.0, 2.0], 0.5)
    g = torch.tensor([1.0, -2.0, 3.0])  # state_dict order: weight (1x2), bias (1)
    half = DynamicRegulariser()
    half.begin_task(model, {ALPHA_KEY: 2.0}, {STATE_KEY: g})
    with torch.no_grad():
        model.weight.add_(torch.tensor([[1.0, -2.0]]))  # θ − θ^{t−1} = (1, −2), bias unchanged
    model.weight.grad = torch.tensor([[10.0, 20.0]])  # the bias has no gradient yet
    half.before_step(model)
    # weight: (10, 20) + 2·(1, −2) − (1, −2) = (11, 18);  bias: 0 + 0 − 3
    assert torch.equal(model.weight.grad, torch.tensor([[11.0, 18.0]]))
    assert torch.equal(model.bias.grad, torch.tensor([-3.0]))
    half.begin_task(model, {ALPHA_KEY: 2.0}, {})  # g_k = 0, anchored at the current weights: nothing to add
    half.before_step(model)
    assert torch.equal(model.weight.grad, torch.tensor([[11.0, 18.0]])) and torch.equal(
        model.bias.grad, torch.tensor([-3.0])
    )


def test_functional_term_known_answer_and_its_gradient_is_what_before_step_adds() -> None:
    # θ = (2, 0 | 1), θ^{t−1} = (1, 2 | 1), g = (1, −2 | 3), α = 2:
    # α/2 ‖θ − θ^{t−1}‖² = 1·(1 + 4) = 5;  ⟨g, θ⟩ = 2 + 0 + 3 = 5;  term = 0
    # gradient −g + α(θ − θ^{t−1}) = (−1 + 2, 2 − 4 | −3) = (1, −2 | −3)
    params = {"weight": torch.tensor([[2.0, 0.0]], requires_grad=True), "bias": torch.tensor([1.0], requires_grad=True)}
    anchor = {"weight": torch.tensor([[1.0, 2.0]]), "bias": torch.tensor([1.0])}
    numbers = {
        ALPHA_KEY: torch.tensor(2.0),
        STATE_KEY: {"weight": torch.tensor([[1.0, -2.0]]), "bias": torch.tensor([3.0])},
    }
    term = DynamicRegulariser().functional_term(params, anchor, numbers)
    assert term is not None and float(term.detach()) == 0.0
    term.backward()
    assert torch.equal(params["weight"].grad, torch.tensor([[1.0, -2.0]])) and torch.equal(
        params["bias"].grad, torch.tensor([-3.0])
    )
    model = _linear([1.0, 2.0], 1.0)
    half = DynamicRegulariser()
    half.begin_task(model, {ALPHA_KEY: 2.0}, {STATE_KEY: torch.tensor([1.0, -2.0, 3.0])})
    with torch.no_grad():
        model.weight.copy_(params["weight"])
    half.before_step(model)
    assert torch.equal(model.weight.grad, params["weight"].grad) and torch.equal(model.bias.grad, params["bias"].grad)
    # without g_k (absent for the whole chunk) the term is the proximal one alone: 5
    assert float(DynamicRegulariser().functional_term(params, anchor, {ALPHA_KEY: torch.tensor(2.0)}).detach()) == 5.0


def test_vectorised_inputs_are_empty_in_the_first_round_then_full_size_for_everyone() -> None:
    half = DynamicRegulariser()
    first = half.vectorised_inputs({ALPHA_KEY: 0.5, SIZE_KEY: 0}, {})
    assert first[ALPHA_KEY] == 0.5 and first[STATE_KEY].shape == (0,)
    newcomer = half.vectorised_inputs({ALPHA_KEY: 0.5, SIZE_KEY: 3}, {})
    assert np.array_equal(newcomer[STATE_KEY], np.zeros(3, dtype=np.float32))
    known = half.vectorised_inputs({ALPHA_KEY: 0.5, SIZE_KEY: 3}, {STATE_KEY: torch.tensor([1.0, 2.0, 3.0])})
    assert np.array_equal(known[STATE_KEY], np.array([1.0, 2.0, 3.0], dtype=np.float32))


def test_client_half_trains_as_the_written_out_loss_term() -> None:
    """Client.fit with the closed-form gradient added before each step equals autograd of
    −⟨g, θ⟩ + α/2 ‖θ − θ^{t−1}‖² as a loss term, with momentum and a frozen layer (whose slice of g is ignored)."""

    class WrittenOut(DynamicRegulariser):
        def before_step(self, model: nn.Module) -> None:
            pass

        def loss_term(self, model: nn.Module) -> torch.Tensor | None:
            trained = [p for p in model.parameters() if p.requires_grad]
            squared = sum(((p - a) ** 2).sum() for p, a in zip(trained, self.anchor, strict=True))
            return 0.5 * self.alpha * squared - sum((p * g).sum() for p, g in zip(trained, self.linear, strict=False))  # type: ignore[return-value]

    data = synthetic(num_devices=1, min_size=80, max_size=80, seed=2).train
    size = 60 * 16 + 16 + 16 * 10 + 10
    g = torch.from_numpy(np.random.default_rng(0).normal(scale=0.1, size=size).astype(np.float32))
    weights = []
    for half in (DynamicRegulariser(), WrittenOut(), None):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(60, 16), nn.Tanh(), nn.Linear(16, 10))
        model[0].bias.requires_grad_(False)
        client = Client(
            0, range(64), epochs=2, batch_size=8, optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)
        )
        update = client.fit(
            model,
            data,
            config={ALPHA_KEY: 0.5},
            state={STATE_KEY: g},
            generator=torch.Generator().manual_seed(1),
            local=half,
        )
        weights.append(update.params)
    fast, written, plain = weights
    assert torch.allclose(fast, written, rtol=1e-5, atol=1e-6)
    assert (fast - plain).norm() > 100 * (fast - written).norm()  # the term really changes training


def _data() -> FederatedData:
    """FedProx's Synthetic(1,1): 8 devices of unequal sizes (20–60 examples), 60 features."""
    return tiny_federation()


def _server(strategy, executor, rounds: int = 3, run_dir: Path | None = None) -> Server:  # type: ignore[no-untyped-def]
    return tiny_server(
        _data(),
        client=functools.partial(Client, epochs=2, batch_size=8),
        strategy=strategy,
        executor=executor,
        num_rounds=rounds,
        seed=5,
        logger=RunLogger(run_dir, tensorboard=False, progress=False),
        checkpoints=Checkpoints(run_dir / "checkpoints", every=1) if run_dir is not None else None,
    )


def test_feddyn_changes_training_and_worker_processes_equal_serial() -> None:
    serial = _server(FedDyn(alpha=0.1), SerialExecutor()).run().params
    assert not torch.equal(serial, _server(FedAvg(), SerialExecutor()).run().params)
    assert torch.equal(serial, _server(FedDyn(alpha=0.1), ProcessExecutor(devices="cpu", workers=2)).run().params)


def test_resume_from_a_checkpoint_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    """h (strategy state) and every g_k (client states) come back from the checkpoint of round 2."""
    full = _server(FedDyn(alpha=0.1), SerialExecutor(), rounds=4).run().params
    _server(FedDyn(alpha=0.1), SerialExecutor(), rounds=2, run_dir=tmp_path).run()
    resumed = _server(FedDyn(alpha=0.1), SerialExecutor(), rounds=4, run_dir=tmp_path)
    resumed.resume(tmp_path)
    assert resumed.start_round == 3 and resumed.strategy.h is not None
    assert torch.equal(resumed.run().params, full)


UNIT_ROUNDOFF = 2.0**-24  # float32; the tolerance of tests/executor/vmap/test_vmap.py


def tolerance(sequential_steps: int, longest_sum: int) -> float:
    """As in tests/executor/vmap/test_vmap.py: float32 rounding along the longest chain of dependent steps, each summing
    up to ``longest_sum`` terms in another order."""
    return sequential_steps * math.sqrt(longest_sum) * UNIT_ROUNDOFF


def test_vmap_matches_serial() -> None:
    """Round 1 without any g_k, rounds 2–3 with clients that hold one next to clients that do not yet."""
    reference = _server(FedDyn(alpha=0.1), SerialExecutor()).run()
    sampled = [{c["client_id"] for c in record["clients"]} for record in reference.history]
    assert sampled[1] & sampled[0] and sampled[1] - sampled[0], "round 2 should mix clients with and without g_k"
    serial, vmapped = reference.params, _server(FedDyn(alpha=0.1), VmapExecutor()).run().params
    error = float((vmapped - serial).norm() / serial.norm())
    longest = 3 * 2 * math.ceil(max(len(c) for c in _data().client_train) / 8)  # rounds × epochs × steps per epoch
    assert error <= tolerance(longest, 60)
    plain = _server(FedAvg(), VmapExecutor()).run().params
    assert float((plain - serial).norm() / serial.norm()) > max(100 * error, 1e-6), "the regulariser must matter"


def test_bad_parameters_name_the_field() -> None:
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match=r"^strategy\.alpha must be a finite number > 0 \(got "):
            FedDyn(alpha=bad)
    assert isinstance(FedDyn().local_training(), DynamicRegulariser) and FedDyn().alpha == 0.01
