"""q-FFL / q-FedAvg: known answers of the rule, q = 0 is the unweighted mean of the client models, the zero-loss
guard, the client half's start loss is the global model's training loss, weighted sampling, worker processes
give the serial result bit for bit, and executor=vmap refuses the client half before any work."""

from __future__ import annotations

import copy
import functools
import math

import numpy as np
import pytest
import torch
from builders import tiny_federation, tiny_server

from fedsim.client import Client, evaluate_indices
from fedsim.client.federation import FederatedData, make_clients
from fedsim.core.params import ParamLayout
from fedsim.core.types import ClientUpdate
from fedsim.executor import ProcessExecutor, SerialExecutor, VmapExecutor, VmapUnsupportedError
from fedsim.models import LogisticRegression
from fedsim.observe.run_logger import RunLogger
from fedsim.server.server import RunResult
from fedsim.strategy import Strategy
from fedsim.strategy.context import RunContext
from fedsim.strategy.functional import weighted_average
from fedsim.strategy.qffl import QFFL, START_LOSS, StartLoss


def _update(cid: int, params: list[float], loss: float | None, lr: float | None = 0.5) -> ClientUpdate:
    metrics = {} if loss is None else {START_LOSS: loss}
    if lr is not None:
        metrics["lr"] = lr
    return ClientUpdate(client_id=cid, round_num=1, params=torch.tensor(params), num_examples=10, metrics=metrics)


def test_q_fedavg_known_answer() -> None:
    # q = 1, L = 2 (lipschitz=2, or 1/lr with lr = 0.5 for every client). w = (1, 1).
    # client 0: w_0 = (0.5, 1), F_0 = 1:   Δw_0 = 2 (w − w_0) = (1, 0), ‖Δw_0‖² = 1
    #           Δ_0 = F_0 Δw_0 = (1, 0);   h_0 = q F_0^0 ‖Δw_0‖² + L F_0 = 1 + 2 = 3
    # client 1: w_1 = (1, 0), F_1 = 0.5:   Δw_1 = (0, 2), ‖Δw_1‖² = 4
    #           Δ_1 = 0.5 (0, 2) = (0, 1); h_1 = 1 · 4 + 2 · 0.5 = 5
    # w ← w − (1, 1) / 8 = (0.875, 0.875)   (the unweighted mean would be (0.75, 0.5))
    w = torch.tensor([1.0, 1.0])
    updates = [_update(0, [0.5, 1.0], 1.0), _update(1, [1.0, 0.0], 0.5)]
    for strategy in (QFFL(q=1.0), QFFL(q=1.0, lipschitz=2.0)):
        assert torch.equal(strategy.aggregate(1, w, updates), torch.tensor([0.875, 0.875]))
        assert strategy.round_metrics(1) == {"start_loss_mean": 0.75, "start_loss_max": 1.0}
    # lipschitz=4 instead of 1/lr = 2: Δw = (2, 0) and (0, 4); Δ = (2, 0), (0, 2); h_0 = 4 + 4 = 8, h_1 = 16 + 2 = 18
    # w ← (1 − 2/26, 1 − 2/26)
    got = QFFL(q=1.0, lipschitz=4.0).aggregate(1, w, updates)
    torch.testing.assert_close(got, torch.tensor([1 - 2 / 26, 1 - 2 / 26]), rtol=0, atol=1e-7)


def test_a_zero_loss_with_q_below_one_weighs_nothing() -> None:
    # q = 0.5, L = 1, w = (0, 0).
    # client 0: F = 0, Δw = (3, 0): F^q = 0 so Δ_0 = 0; q F^{q−1} ‖Δw‖² = 0.5 · inf · 9 is taken as 0: h_0 = 0
    # client 1: F = 16, Δw = (0, 4): Δ_1 = 4 (0, 4) = (0, 16); h_1 = 0.5 · 16^{-0.5} · 16 + 16^{0.5} = 2 + 4 = 6
    # client 2: F = 4, Δw = 0:       Δ_2 = 0;                  h_2 = 0 + 4^{0.5} = 2
    # w ← −(0, 16) / 8 = (0, −2)
    updates = [_update(0, [-3.0, 0.0], 0.0), _update(1, [0.0, -4.0], 16.0), _update(2, [0.0, 0.0], 4.0)]
    assert torch.equal(QFFL(q=0.5, lipschitz=1.0).aggregate(1, torch.zeros(2), updates), torch.tensor([0.0, -2.0]))
    # every start loss 0 (q > 0): Σ h = 0, nothing to correct: the model stays as it was
    w = torch.tensor([0.25, -1.0])
    zeros = [_update(0, [5.0, 5.0], 0.0), _update(3, [-5.0, 1.0], 0.0)]
    assert torch.equal(QFFL(q=2.0).aggregate(1, w, zeros), w)


def test_a_zero_loss_with_q_one_keeps_its_curvature_term() -> None:
    # The paper's h_k = q F_k^{q−1} ‖Δw_k‖² + L F_k^q with 0^0 = 1: q = 1, F_0 = 0 gives h_0 = ‖Δw_0‖².
    # q = 1, L = 2 (1/lr, lr = 0.5), w = (1, 1).
    # client 0: w_0 = (0.5, 0.5), F_0 = 0: Δw_0 = 2 (0.5, 0.5) = (1, 1), ‖Δw_0‖² = 2
    #           Δ_0 = 0 · Δw_0 = 0;          h_0 = 1 · 0^0 · 2 + 2 · 0 = 2
    # client 1: w_1 = (1, 0), F_1 = 1:     Δw_1 = (0, 2), ‖Δw_1‖² = 4
    #           Δ_1 = 1 · (0, 2) = (0, 2);   h_1 = 1 · 1 · 4 + 2 · 1 = 6
    # w ← w − (0, 2) / 8 = (1, 0.75)   (dropping h_0 would give (1, 1 − 1/3))
    w = torch.tensor([1.0, 1.0])
    updates = [_update(0, [0.5, 0.5], 0.0), _update(1, [1.0, 0.0], 1.0)]
    assert torch.equal(QFFL(q=1.0).aggregate(1, w, updates), torch.tensor([1.0, 0.75]))
    # every start loss 0 with q = 1: Σ h = ‖Δw_0‖² + ‖Δw_1‖² > 0 but Σ Δ = 0: the model stays as it was
    zeros = [_update(0, [0.5, 0.5], 0.0), _update(1, [1.0, 0.0], 0.0)]
    assert torch.equal(QFFL(q=1.0).aggregate(1, w, zeros), w)


def test_q_zero_is_the_unweighted_mean_of_the_client_models() -> None:
    # q = 0: Δ_k = L (w − w_k), h_k = L: w − Σ (w − w_k) / m = mean of w_k, whatever the losses (a zero one included)
    # (2 − 1 + 5 + 0) / 4 = 1.5, (4 + 0.5 − 2 + 1) / 4 = 0.875
    w = torch.tensor([1.0, 2.0])
    updates = [
        _update(0, [2.0, 4.0], 0.3, lr=0.25),
        _update(2, [-1.0, 0.5], 2.0, lr=0.25),
        _update(5, [5.0, -2.0], 0.0, lr=0.25),
        _update(9, [0.0, 1.0], 7.5, lr=0.25),
    ]
    expected = torch.tensor([1.5, 0.875])
    assert torch.equal(QFFL(q=0.0).aggregate(1, w, updates), expected)
    assert torch.equal(weighted_average([u.params for u in updates], [1.0] * 4), expected)
    # random weights and losses: equal to the float64 mean up to float32 rounding
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(1000, generator=gen)
    params = [w + 0.1 * torch.randn(1000, generator=gen) for _ in range(7)]
    updates = [
        ClientUpdate(k, 1, p, num_examples=k + 1, metrics={START_LOSS: float(k) / 3, "lr": 0.1})
        for k, p in enumerate(params)
    ]
    mean = torch.stack(params).double().mean(dim=0).float()
    torch.testing.assert_close(QFFL(q=0.0).aggregate(1, w, updates), mean, rtol=2.0**-23, atol=0.0)


def test_a_bad_update_is_refused_before_anything_changes() -> None:
    s = QFFL()
    s.aggregate(1, torch.zeros(2), [_update(0, [1.0, 0.0], 2.0)])
    before = s.round_metrics(1)
    missing = r"^QFFL needs the metric 'qffl_start_loss' in every update \(client 3 has none"
    with pytest.raises(ValueError, match=missing):
        s.aggregate(2, torch.zeros(2), [_update(1, [1.0, 0.0], 1.0), _update(3, [0.0, 1.0], None)])
    for bad in (-0.5, math.nan, math.inf):
        with pytest.raises(ValueError, match=rf"^QFFL needs a finite qffl_start_loss >= 0 \(client 1 reported {bad}\)"):
            s.aggregate(2, torch.zeros(2), [_update(1, [1.0, 0.0], bad)])
    with pytest.raises(ValueError, match=r"^QFFL needs the metric 'lr' in every update when strategy.lipschitz is"):
        s.aggregate(2, torch.zeros(2), [_update(1, [1.0, 0.0], 1.0, lr=None)])
    with pytest.raises(ValueError, match=r"^QFFL needs lr > 0 to take L = 1/lr \(client 1 reported 0.0\)$"):
        s.aggregate(2, torch.zeros(2), [_update(1, [1.0, 0.0], 1.0, lr=0.0)])
    assert s.round_metrics(2) == before, "a refused round must leave the strategy as it was"
    # with an explicit L the learning rate is not needed
    QFFL(lipschitz=1.0).aggregate(1, torch.zeros(2), [_update(1, [1.0, 0.0], 1.0, lr=None)])


def test_bad_parameters_name_the_field() -> None:
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match=r"^strategy\.q must be a finite number >= 0 \(got "):
            QFFL(q=bad)
    for bad in (0.0, -2.0, math.nan, math.inf):
        with pytest.raises(ValueError, match=r"^strategy\.lipschitz must be > 0, or null for 1/lr \(got "):
            QFFL(lipschitz=bad)
    with pytest.raises(ValueError, match=r"^strategy\.sampling must be one of weighted, uniform \(got 'size'\)$"):
        QFFL(sampling="size")
    s = QFFL(q=0, lipschitz=3)
    assert (s.q, s.lipschitz, s.sampling) == (0.0, 3.0, "weighted") and s.keeps_stragglers and s.state_dict() == {}
    assert isinstance(s.local_training(), StartLoss)


def _context(num_examples: tuple[int, ...], clients_per_round: int) -> RunContext:
    return RunContext(
        layout=ParamLayout.of(torch.nn.Linear(2, 1)),
        num_clients=len(num_examples),
        num_examples=num_examples,
        clients_per_round=clients_per_round,
        num_rounds=1,
        seed=0,
    )


def test_weighted_sampling_follows_the_client_sizes() -> None:
    sizes = (0, 10, 0, 1000, 10, 10, 0, 10)
    s = QFFL()
    s.setup(_context(sizes, 2))
    counts = np.zeros(len(sizes))
    for r in range(400):
        chosen = s.sample(r, len(sizes), 2, np.random.default_rng(r))
        assert chosen == sorted(set(chosen)) and len(chosen) == 2
        assert chosen == s.sample(r, len(sizes), 2, np.random.default_rng(r)), "a pure function of the rng"
        counts[chosen] += 1
    assert counts[[0, 2, 6]].sum() == 0, "a client without examples is never sampled"
    assert counts[3] == 400, "the client holding 97 % of the examples is in (almost) every round"
    uniform = QFFL(sampling="uniform")
    assert uniform.sample(1, 8, 3, np.random.default_rng(5)) == Strategy().sample(1, 8, 3, np.random.default_rng(5))
    with pytest.raises(
        ValueError,
        match=r"^strategy.sampling=weighted needs at least clients_per_round=6 clients "
        r"with training examples \(got 5\); use strategy.sampling=uniform$",
    ):
        QFFL().setup(_context(sizes, 6))
    QFFL(sampling="uniform").setup(_context(sizes, 6))


def _data() -> FederatedData:
    """FedProx's Synthetic(1,1): 8 devices of unequal sizes (20–60 examples), 60 features."""
    return tiny_federation()


def test_the_client_half_records_the_global_models_training_loss_and_changes_no_training() -> None:
    data = _data()
    client = make_clients(data, functools.partial(Client, epochs=2, batch_size=8))[5]
    torch.manual_seed(0)
    model = LogisticRegression((60,), 10)
    start = copy.deepcopy(model)
    expected = evaluate_indices(start, data.train, torch.from_numpy(client.train_indices))["loss"]
    plain = copy.deepcopy(model)
    config = {"lr": 0.1}
    update = client.fit(model, data.train, config=config, generator=torch.Generator().manual_seed(7), local=StartLoss())
    assert update.metrics[START_LOSS] == pytest.approx(expected, rel=1e-6)
    reference = client.fit(plain, data.train, config=config, generator=torch.Generator().manual_seed(7))
    assert torch.equal(update.params, reference.params), "measuring F_k(w^t) must not change the local training"
    assert update.metrics["train_loss"] < update.metrics[START_LOSS]


def _run(strategy: Strategy, executor, *, rounds: int = 3) -> RunResult:  # type: ignore[no-untyped-def]
    return tiny_server(
        _data(),
        client=functools.partial(Client, epochs=2, batch_size=8),
        strategy=strategy,
        executor=executor,
        num_rounds=rounds,
        seed=5,
        logger=RunLogger(None, tensorboard=False, progress=False),
    ).run()


class UnweightedMean(Strategy):
    """The plain mean of the client models (uniform FedAvg)."""

    def aggregate(self, round_num, global_params, updates):  # type: ignore[no-untyped-def]
        return weighted_average([u.params for u in updates], [1.0] * len(updates))


def test_q_zero_in_a_real_run_is_uniform_fedavg() -> None:
    qffl = _run(QFFL(q=0.0, sampling="uniform"), SerialExecutor())
    mean = _run(UnweightedMean(), SerialExecutor())
    torch.testing.assert_close(qffl.params, mean.params, rtol=1e-6, atol=1e-7)
    record = qffl.history[-1]
    assert record["strategy/start_loss_max"] >= record["strategy/start_loss_mean"] > 0
    assert record["fit/qffl_start_loss"] > 0


def test_qffl_in_worker_processes_equals_serial() -> None:
    serial = _run(QFFL(q=1.0), SerialExecutor())
    process = _run(QFFL(q=1.0), ProcessExecutor(devices="cpu", workers=2))
    assert torch.equal(serial.params, process.params)
    key = "strategy/start_loss_mean"
    assert [r[key] for r in serial.history] == [r[key] for r in process.history]


def test_vmap_refuses_the_client_half_when_the_server_is_built() -> None:
    refusal = r"client half StartLoss: .*\(StartLoss.before_training\); use executor=process$"
    with pytest.raises(VmapUnsupportedError, match=refusal):
        _run(QFFL(), VmapExecutor())
