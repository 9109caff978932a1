"""FedNova: known answers of normalised averaging; equal local steps are FedAvg; unequal ones are re-weighted as the
formula says; worker processes and vmap give the serial result."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from builders import tiny_federation, tiny_server

from fedsim.client.base import Client
from fedsim.client.federation import FederatedData
from fedsim.core.types import ClientUpdate
from fedsim.executor import ProcessExecutor, SerialExecutor, VmapExecutor
from fedsim.observe.run_logger import RunLogger
from fedsim.server.server import RunResult
from fedsim.server.settings import Stages
from fedsim.server.stragglers import Stragglers
from fedsim.strategy import FedAvg
from fedsim.strategy.fednova import FedNova


def _update(cid: int, params: list[float], n: int, steps: float) -> ClientUpdate:
    return ClientUpdate(
        client_id=cid,
        round_num=1,
        params=torch.tensor(params),
        num_examples=n,
        metrics={"local_steps": steps, "lr": 0.1},
    )


def test_normalised_averaging_known_answer() -> None:
    # w = (1, 0). client 0: n=1, τ=1, w_0 = (3, 0)  → d_0 = (w - w_0)/1 = (-2, 0)
    #             client 1: n=3, τ=4, w_1 = (5, 4)  → d_1 = (w - w_1)/4 = (-1, -1)
    # p = (1/4, 3/4); τ_eff = 1/4 + 3 = 3.25; Σ p d = (-0.5 - 0.75, -0.75) = (-1.25, -0.75)
    # w ← w - τ_eff Σ p d = (1 + 4.0625, 2.4375) = (5.0625, 2.4375)   (FedAvg: (4.5, 3))
    w = torch.tensor([1.0, 0.0])
    updates = [_update(0, [3.0, 0.0], 1, 1.0), _update(1, [5.0, 4.0], 3, 4.0)]
    s = FedNova()
    assert torch.equal(s.aggregate(1, w, updates), torch.tensor([5.0625, 2.4375]))
    assert s.round_metrics(1) == {"tau_eff": 3.25}
    assert torch.equal(FedAvg().aggregate(1, w, updates), torch.tensor([4.5, 3.0]))
    # server_lr = 0.5 halves the step: w - 0.5 τ_eff Σ p d = (1 + 2.03125, 1.21875)
    assert torch.equal(FedNova(server_lr=0.5).aggregate(1, w, updates), torch.tensor([3.03125, 1.21875]))


def test_equal_local_steps_reduce_to_fedavg() -> None:
    # τ = 3 for all: τ_eff = 3 and w - 3 Σ p (w - w_k)/3 = Σ p w_k. n = (1, 2, 5) of 8:
    # x = (2 + 2·(-1) + 5·6)/8 = 3.75, y = (4 + 2·0.5 + 5·(-2))/8 = -0.625
    w = torch.tensor([0.5, -1.5])
    updates = [_update(0, [2.0, 4.0], 1, 3.0), _update(4, [-1.0, 0.5], 2, 3.0), _update(7, [6.0, -2.0], 5, 3.0)]
    assert torch.equal(FedNova().aggregate(1, w, updates), torch.tensor([3.75, -0.625]))
    assert torch.equal(FedAvg().aggregate(1, w, updates), torch.tensor([3.75, -0.625]))


def test_a_client_without_examples_weighs_nothing() -> None:
    # a client with 0 examples does 0 steps (Client.fit) and returns w: it is skipped, not divided by 0
    w = torch.tensor([1.0, 1.0])
    s = FedNova()
    got = s.aggregate(1, w, [_update(0, [1.0, 1.0], 0, 0.0), _update(2, [3.0, -1.0], 2, 2.0)])
    assert torch.equal(got, torch.tensor([3.0, -1.0])) and s.round_metrics(1) == {"tau_eff": 2.0}


def test_an_update_without_local_steps_is_refused_before_anything_changes() -> None:
    s = FedNova()
    s.aggregate(1, torch.zeros(2), [_update(0, [1.0, 0.0], 1, 2.0)])
    bare = ClientUpdate(client_id=3, round_num=2, params=torch.tensor([1.0, 1.0]), num_examples=1)
    with pytest.raises(ValueError, match=r"^FedNova needs the metric 'local_steps' in every update"):
        s.aggregate(2, torch.zeros(2), [_update(1, [1.0, 0.0], 1, 5.0), bare])
    assert s.round_metrics(2) == {"tau_eff": 2.0}, "a refused round must leave the strategy as it was"
    with pytest.raises(ValueError, match=r"^FedNova needs local_steps > 0 \(client 1 reported 0\.0\)$"):
        s.aggregate(2, torch.zeros(2), [_update(1, [1.0, 0.0], 1, 0.0)])


def test_bad_parameters_name_the_field() -> None:
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match=r"^strategy\.server_lr must be a finite number > 0 \(got "):
            FedNova(server_lr=bad)
    assert FedNova.keeps_stragglers and FedNova().state_dict() == {}


def _data() -> FederatedData:
    """FedProx's Synthetic(1,1): 8 devices of unequal sizes (20–60 examples), 60 features."""
    return tiny_federation()


def _run(strategy, executor, *, batch_size: int = 8, stragglers=None, rounds: int = 3) -> RunResult:  # type: ignore[no-untyped-def]
    return tiny_server(
        _data(),
        client=functools.partial(Client, epochs=2, batch_size=batch_size),
        strategy=strategy,
        executor=executor,
        num_rounds=rounds,
        seed=5,
        logger=RunLogger(None, tensorboard=False, progress=False),
        stages=Stages(stragglers=stragglers),
    ).run()


def test_equal_local_steps_in_a_real_run_are_fedavg() -> None:
    """One batch per epoch (batch_size ≥ every client's size): τ_k = 2 for every client, so FedNova is FedAvg up to
    the float32 rounding of a float64 sum."""
    assert max(len(c) for c in _data().client_train) <= 64
    nova, avg = _run(FedNova(), SerialExecutor(), batch_size=64), _run(FedAvg(), SerialExecutor(), batch_size=64)
    torch.testing.assert_close(nova.params, avg.params, rtol=1e-6, atol=1e-7)
    assert all(r["strategy/tau_eff"] == 2.0 for r in nova.history)


class Recording(FedNova):
    """FedNova that records what each round aggregated."""

    def __init__(self) -> None:
        super().__init__()
        self.rounds: list[tuple[torch.Tensor, list[ClientUpdate], torch.Tensor]] = []

    def aggregate(self, round_num, global_params, updates):  # type: ignore[no-untyped-def]
        new = super().aggregate(round_num, global_params, updates)
        self.rounds.append((global_params.clone(), list(updates), new))
        return new


def test_unequal_local_steps_reweight_each_update_by_tau_eff_over_tau_k() -> None:
    """Clients of different sizes and stragglers do different numbers of steps; FedNova weighs client k's
    update w_k − w by p_k τ_eff / τ_k instead of FedAvg's p_k (more steps than τ_eff: less weight)."""
    strategy = Recording()
    result = _run(strategy, SerialExecutor(), stragglers=Stragglers(fraction=0.5, epochs=2, seed=1))
    for (w, updates, new), record in zip(strategy.rounds, result.history, strict=True):
        n = [u.num_examples for u in updates]
        tau = [u.metrics["local_steps"] for u in updates]
        assert len(set(tau)) > 1, "the round should mix clients with different numbers of local steps"
        p = [k / sum(n) for k in n]
        tau_eff = sum(pk * tk for pk, tk in zip(p, tau, strict=True))
        assert record["strategy/tau_eff"] == pytest.approx(tau_eff, rel=1e-12)
        expected = w.double() + sum(
            pk * tau_eff / tk * (u.params.double() - w.double()) for pk, tk, u in zip(p, tau, updates, strict=True)
        )
        torch.testing.assert_close(new, expected.float(), rtol=1e-6, atol=1e-7)
        fedavg = FedAvg().aggregate(1, w, updates)
        assert (new - fedavg).norm() > 1e-3 * (fedavg - w).norm(), "unequal steps must change the aggregate"


def test_fednova_in_worker_processes_equals_serial() -> None:
    stragglers = Stragglers(fraction=0.5, epochs=2, seed=1)
    serial = _run(FedNova(), SerialExecutor(), stragglers=stragglers).params
    assert torch.equal(serial, _run(FedNova(), ProcessExecutor(devices="cpu", workers=2), stragglers=stragglers).params)


UNIT_ROUNDOFF = 2.0**-24  # float32; the tolerance of tests/executor/vmap/test_vmap.py


def tolerance(sequential_steps: int, longest_sum: int) -> float:
    """As in tests/executor/vmap/test_vmap.py: float32 rounding along the longest chain of dependent steps, each summing
    up to ``longest_sum`` terms in another order."""
    return sequential_steps * math.sqrt(longest_sum) * UNIT_ROUNDOFF


def test_vmap_matches_serial() -> None:
    stragglers = Stragglers(fraction=0.5, epochs=2, seed=1)
    serial = _run(FedNova(), SerialExecutor(), stragglers=stragglers).params
    vmapped = _run(FedNova(), VmapExecutor(), stragglers=stragglers).params
    longest = 3 * 2 * math.ceil(max(len(c) for c in _data().client_train) / 8)  # rounds × epochs × steps per epoch
    assert float((vmapped - serial).norm() / serial.norm()) <= tolerance(longest, 60)
