"""Server: the round loop end to end with the serial executor (learning, determinism, sampling,
failures, user strategies, very large federations)."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from builders import sgd, tiny_federation, tiny_server
from torch import nn

from fedsim.client.base import Client
from fedsim.client.federation import FederatedData, federate, make_clients
from fedsim.core.params import flatten
from fedsim.core.seeding import sampling_rng
from fedsim.core.types import ClientUpdate
from fedsim.data.partition import iid
from fedsim.data.tensor_data import DataSplit, TensorData
from fedsim.models import LogisticRegression
from fedsim.observe.run_logger import RunLogger
from fedsim.server.server import RoundFailedError, RunResult, Server
from fedsim.server.settings import Evaluation
from fedsim.strategy import FedAvg, Strategy


def _federation(num_devices: int = 12) -> FederatedData:
    """Tiny Synthetic(1, 1): 12 devices of 30..60 examples, 10 features, 5 classes, natural clients."""
    return tiny_federation(num_devices, num_features=10, num_classes=5, min_size=30, size_sigma_log=0.5)


def _server(*, client_cls: Any = Client, eval_every: int = 1, lr: float = 0.05, **settings: Any) -> Server:
    """:func:`builders.tiny_server` on :func:`_federation`: 2 epochs of batch 10, SGD at ``lr``."""
    factory = functools.partial(client_cls, epochs=2, batch_size=10, optimizer=sgd(lr))
    return tiny_server(_federation(), client=factory, evaluation=Evaluation(every=eval_every), **settings)


# --- learning -------------------------------------------------------------------------------------


def test_run_learns_better_than_chance_and_the_initial_model() -> None:
    server = _server(num_rounds=8, clients_per_round=6, lr=0.1)
    initial = server.evaluate()["eval/accuracy"]
    result = server.run()
    assert isinstance(result, RunResult)
    test_labels = _federation().test.y
    majority = float(torch.bincount(test_labels).max()) / len(test_labels)
    final = result.history[-1]["eval/accuracy"]
    assert final > max(majority, initial) + 0.05, (final, majority, initial)
    assert [r["round"] for r in result.history] == list(range(1, 9))
    assert all(r["client/num_sampled"] == 6 and r["client/num_failed"] == 0 for r in result.history)
    assert torch.equal(flatten(result.model), result.params)  # the returned model holds the final weights
    losses = [r["eval/loss"] for r in result.history]
    assert losses[-1] < losses[0]


def test_eval_every_evaluates_on_schedule_and_after_the_last_round() -> None:
    result = _server(num_rounds=5, eval_every=2).run()
    evaluated = [r["round"] for r in result.history if "eval/accuracy" in r]
    assert evaluated == [2, 4, 5]
    assert all("train/loss" in r and "time/round_s" in r for r in result.history)
    assert all(0 < r["time/fit_s"] < r["time/round_s"] for r in result.history)
    evaluated = [r for r in result.history if "eval/accuracy" in r]
    assert evaluated and all(0 < r["time/eval_s"] < r["time/round_s"] - r["time/fit_s"] + 1e-9 for r in evaluated)
    assert all(("time/eval_s" in r) == ("eval/accuracy" in r) for r in result.history)


def test_server_rejects_more_clients_per_round_than_clients() -> None:
    with pytest.raises(ValueError, match="clients_per_round"):
        _server(clients_per_round=13)
    with pytest.raises(ValueError, match="clients_per_round"):
        _server(clients_per_round=0)


# --- determinism ------------------------------------------------------------------------------------


def test_same_seed_gives_bitwise_identical_final_params_whatever_the_global_rng() -> None:
    torch.manual_seed(1)
    np.random.seed(1)
    a = _server(seed=11).run()
    torch.manual_seed(12345)
    np.random.seed(12345)
    b = _server(seed=11).run()
    assert torch.equal(a.params, b.params)
    strip = lambda h: [{k: v for k, v in r.items() if not k.startswith(("time/", "system/"))} for r in h]  # noqa: E731
    assert strip(a.history) == strip(b.history)


def test_different_seed_gives_different_final_params() -> None:
    assert not torch.equal(_server(seed=1).run().params, _server(seed=2).run().params)


def test_server_does_not_touch_the_global_torch_rng() -> None:
    torch.manual_seed(7)
    state = torch.random.get_rng_state()
    _server(num_rounds=1).run()
    assert torch.equal(torch.random.get_rng_state(), state)


# --- sampling ---------------------------------------------------------------------------------------


def test_sampling_is_a_pure_function_of_seed_and_round() -> None:
    strategy = Strategy()
    first = strategy.sample(3, 1000, 10, sampling_rng(42, 3))
    again = Strategy().sample(3, 1000, 10, sampling_rng(42, 3))
    assert first == again
    assert first == sorted(set(first)) and len(first) == 10 and all(0 <= c < 1000 for c in first)
    assert first != strategy.sample(4, 1000, 10, sampling_rng(42, 4))  # another round
    assert first != strategy.sample(3, 1000, 10, sampling_rng(43, 3))  # another seed
    rounds = {tuple(strategy.sample(r, 1000, 10, sampling_rng(42, r))) for r in range(1, 21)}
    assert len(rounds) == 20


def test_sampling_can_take_every_client() -> None:
    assert Strategy().sample(1, 7, 7, sampling_rng(0, 1)) == list(range(7))


class RecordingFedAvg(FedAvg):
    """FedAvg that remembers which clients reported in which round."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, list[int]] = {}

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        self.seen[round_num] = [u.client_id for u in updates]
        return super().aggregate(round_num, global_params, updates)


def test_server_trains_exactly_the_clients_sampled_from_seed_and_round() -> None:
    strategy = RecordingFedAvg()
    _server(seed=5, strategy=strategy, num_rounds=4, clients_per_round=3).run()
    expected = {r: Strategy().sample(r, 12, 3, sampling_rng(5, r)) for r in range(1, 5)}
    assert strategy.seen == expected  # also: updates arrive sorted by client id


# --- failures -----------------------------------------------------------------------------------------

BAD_CLIENT = 7


class FlakyClient(Client):
    """Client 7 always raises."""

    def fit(self, model: nn.Module, data: TensorData, **kwargs: Any) -> ClientUpdate:
        if self.client_id == BAD_CLIENT:
            raise RuntimeError(f"disk on fire at client {self.client_id}")
        return super().fit(model, data, **kwargs)


def test_failing_client_with_strict_policy_raises_round_failed_error_naming_it() -> None:
    server = _server(client_cls=FlakyClient, clients_per_round=12, min_success_fraction=1.0)
    with pytest.raises(RoundFailedError) as info:
        server.run()
    message = str(info.value)
    assert f"client {BAD_CLIENT}" in message and "disk on fire" in message and "round 1" in message
    assert "1 of 12" in message


def test_failing_client_with_lenient_policy_is_recorded(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    strategy = RecordingFedAvg()
    logger = RunLogger(tmp_path, tensorboard=True, progress=False)
    result = _server(
        client_cls=FlakyClient,
        strategy=strategy,
        clients_per_round=12,
        num_rounds=2,
        min_success_fraction=0.5,
        logger=logger,
    ).run()
    assert [r["client/num_failed"] for r in result.history] == [1.0, 1.0]
    assert all(BAD_CLIENT not in ids and len(ids) == 11 for ids in strategy.seen.values())
    sizes = [len(t) for i, t in enumerate(_federation().client_train) if i != BAD_CLIENT]
    assert result.history[0]["client/num_examples"] == sum(sizes)

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["client/num_failed"] for r in records] == [1.0, 1.0]
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    failed = events.Scalars("participants/num_failed")  # TensorBoard groups client/ after eval/
    assert [(e.step, e.value) for e in failed] == [(1, 1.0), (2, 1.0)]
    texts = [e.tensor_proto.string_val[0].decode() for e in events.Tensors("failures/text_summary")]
    assert len(texts) == 2 and all(f"client {BAD_CLIENT}" in t and "disk on fire" in t for t in texts)


def test_round_where_every_client_fails_raises_even_with_a_lenient_policy() -> None:
    class AlwaysFails(Client):
        def fit(self, model: nn.Module, data: TensorData, **kwargs: Any) -> ClientUpdate:
            raise ValueError("nope")

    with pytest.raises(RoundFailedError, match="nope"):
        _server(client_cls=AlwaysFails, min_success_fraction=0.01).run()


# --- a user-defined strategy through the Python API ---------------------------------------------------


class CoordinateMedian(Strategy):
    """Coordinate-wise median of the client weights, mixed in with a server step size; asks for 2 epochs."""

    def __init__(self, server_lr: float = 1.0) -> None:
        self.server_lr = server_lr
        self.calls: list[tuple[int, list[int], list[int]]] = []

    def client_config(self, round_num: int, client_id: int) -> dict[str, Any]:
        return {"epochs": 1 + round_num % 2}

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        self.calls.append((round_num, [u.client_id for u in updates], [len(u.epoch_losses) for u in updates]))
        median = torch.stack([u.params for u in updates]).median(dim=0).values
        return global_params + self.server_lr * (median - global_params)


def test_user_defined_strategy_runs_through_the_python_api() -> None:
    strategy = CoordinateMedian()
    result = _server(strategy=strategy, num_rounds=3, clients_per_round=5).run()
    assert [c[0] for c in strategy.calls] == [1, 2, 3]
    assert all(ids == sorted(ids) and len(ids) == 5 for _, ids, _ in strategy.calls)
    assert [epochs for *_, epochs in strategy.calls] == [[2] * 5, [1] * 5, [2] * 5]  # client_config reached the clients
    assert not torch.equal(result.params, _server(num_rounds=3, clients_per_round=5).run().params)  # not FedAvg


def test_user_strategy_that_keeps_the_global_model_keeps_it() -> None:
    server = _server(strategy=CoordinateMedian(server_lr=0.0), num_rounds=2)
    initial = server.params.clone()
    result = server.run()
    assert torch.equal(result.params, initial)
    assert result.history[0]["eval/accuracy"] == result.history[1]["eval/accuracy"]


# --- a very large federation ----------------------------------------------------------------------------

NUM_CLIENTS = 100_000


class CountingClient(Client):
    """Counts fit calls per client id in a class-level dict (the serial executor runs in this process)."""

    fits: Counter[int] = Counter()

    def fit(self, model: nn.Module, data: TensorData, **kwargs: Any) -> ClientUpdate:
        CountingClient.fits[self.client_id] += 1
        return super().fit(model, data, **kwargs)


def test_hundred_thousand_clients_only_the_sampled_ones_train() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2 * NUM_CLIENTS, 4, generator=gen)
    y = (x[:, 0] > 0).long()
    test = TensorData(x[:200].clone(), y[:200].clone(), 2)
    split = DataSplit(train=TensorData(x, y, 2), test=test)
    data = federate(split, functools.partial(iid, num_clients=NUM_CLIENTS), client_test_fraction=0.5, seed=0)
    assert data.num_clients == NUM_CLIENTS
    CountingClient.fits.clear()
    clients = make_clients(data, functools.partial(CountingClient, batch_size=2))
    assert len(clients) == NUM_CLIENTS and all(c.num_train == 1 for c in clients[:100])
    server = tiny_server(
        data, model=functools.partial(LogisticRegression, (4,), 2), clients=clients, clients_per_round=10, seed=9
    )
    result = server.run()
    sampled = [Strategy().sample(r, NUM_CLIENTS, 10, sampling_rng(9, r)) for r in (1, 2, 3)]
    expected = Counter(cid for ids in sampled for cid in ids)
    assert CountingClient.fits == expected
    assert sum(CountingClient.fits.values()) == 30
    assert [r["client/num_sampled"] for r in result.history] == [10.0, 10.0, 10.0]
    assert [r["client/num_examples"] for r in result.history] == [10.0, 10.0, 10.0]


# --- the server's thread budget ------------------------------------------------------------------


class _ThreadsSeen(FedAvg):
    """FedAvg that records torch's thread count whenever it aggregates (the server's own work)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        self.seen.append(torch.get_num_threads())
        return super().aggregate(round_num, global_params, updates)


def test_server_work_runs_on_its_thread_budget_and_the_callers_setting_comes_back() -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        strategy = _ThreadsSeen()
        one = _server(strategy=strategy).run()  # Server(threads=1) by default
        assert strategy.seen == [1, 1, 1]
        assert torch.get_num_threads() == 3
        untouched = _ThreadsSeen()
        server = _server(strategy=untouched)
        server.parts.schedule = dataclasses.replace(server.parts.schedule, threads=None)
        other = server.run()
        assert untouched.seen == [3, 3, 3]
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(one.params, other.params), "the weights do not depend on the server's thread count"


def test_rounds_driven_one_by_one_run_on_the_same_thread_budget_as_run() -> None:
    """A caller that starts the executor and calls ``run_round`` itself (as the benchmarks do) gets the server's
    thread budget too, its own setting back after each round, and the weights of ``run()``."""
    previous = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        whole = _server().run()
        strategy = _ThreadsSeen()
        server = _server(strategy=strategy)
        server.parts.executor.start(server.workload())  # as Server.run does
        for round_num in (1, 2, 3):
            server.run_round(round_num)
            assert torch.get_num_threads() == 3
        server.parts.executor.close()
    finally:
        torch.set_num_threads(previous)
    assert strategy.seen == [1, 1, 1]
    assert torch.equal(server.params, whole.params)
