"""``client.local_steps``: K batches a task whatever the client's size. Known answers: exactly K optimizer steps, the
batches cut from reshuffled passes drawn from the task's generator, K = E · ⌈n / B⌉ trains bitwise as E epochs; the
round config's K (a straggler's 1..K − 1), the reported ``local_steps`` that FedNova and SCAFFOLD read, and the
one-line refusals (K < 1, DP-SGD, a client with its own epoch loop, the simulated clock)."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from fedsim.client.base import Client
from fedsim.client.federation import federate, make_clients
from fedsim.core.params import flatten, load_flat
from fedsim.core.types import ClientUpdate
from fedsim.data.partition import natural
from fedsim.data.synthetic import synthetic
from fedsim.data.tensor_data import TensorData
from fedsim.executor import SerialExecutor
from fedsim.models import LogisticRegression
from fedsim.observe.run_logger import RunLogger
from fedsim.privacy.local import DPSGDClient
from fedsim.server.server import Server
from fedsim.server.settings import Federation, Schedule, Stages
from fedsim.server.stragglers import Stragglers
from fedsim.sim.clock import sampled_clock
from fedsim.strategy import FedAvg, FedNova, FedProx, Scaffold
from fedsim.strategy.scaffold import STATE_KEY

N, BATCH = 10, 4  # ⌈10 / 4⌉ = 3 batches a pass: 4, 4, 2 examples
PER_PASS = math.ceil(N / BATCH)


def _data() -> TensorData:
    """Example i has label i (a recorder reads back which examples a step saw) and features from a fixed draw."""
    x = torch.randn(N, 3, generator=torch.Generator().manual_seed(1))
    return TensorData(x, torch.arange(N), N)


class Recorder(Client):
    """Notes the labels (= example indices) of every batch it steps on, in a list the test owns."""

    seen: list[list[int]] = []

    def train_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> Any:
        Recorder.seen.append(y.tolist())
        return super().train_step(model, optimizer, x, y)


def _counting_sgd(counter: list[int]) -> Any:
    """An SGD factory whose optimizers count their steps into ``counter``."""

    def build(params: Any) -> torch.optim.Optimizer:
        optimizer = torch.optim.SGD(params, lr=0.1)
        optimizer.register_step_post_hook(lambda *_: counter.append(1))
        return optimizer

    return build


def _fit(client: Client, config: dict[str, Any] | None = None, seed: int = 3) -> ClientUpdate:
    model = LogisticRegression((3,), N)
    load_flat(model, torch.zeros(flatten(model).numel()))
    return client.fit(model, _data(), config=config, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("k", [1, 2, PER_PASS, PER_PASS + 1, 2 * PER_PASS + 2, 7 * PER_PASS])
def test_k_local_steps_are_exactly_k_optimizer_steps(k: int) -> None:
    steps: list[int] = []
    client = Client(0, np.arange(N), epochs=5, batch_size=BATCH, optimizer=_counting_sgd(steps), local_steps=k)
    update = _fit(client)
    assert len(steps) == k  # epochs=5 is not read
    assert update.metrics["local_steps"] == k
    assert len(update.epoch_losses) == math.ceil(k / PER_PASS)  # one mean loss per pass, the last maybe partial


def test_batches_are_cut_from_passes_reshuffled_by_the_task_generator() -> None:
    Recorder.seen = []
    _fit(Recorder(0, np.arange(N), batch_size=BATCH, local_steps=8), seed=11)
    generator, expected = torch.Generator().manual_seed(11), []
    for _ in range(3):  # 8 batches need three passes of 3: each a fresh permutation from the task's generator
        order = torch.randperm(N, generator=generator).tolist()
        expected += [order[0:4], order[4:8], order[8:10]]
    assert Recorder.seen == expected[:8]  # the third pass stops after its 2nd batch
    assert len({tuple(sorted(sum(Recorder.seen[i : i + 3], []))) for i in (0, 3)}) == 1  # a pass sees every example


def test_k_equal_to_whole_epochs_trains_bitwise_as_those_epochs() -> None:
    by_epochs = _fit(Client(0, np.arange(N), epochs=3, batch_size=BATCH))
    by_steps = _fit(Client(0, np.arange(N), epochs=1, batch_size=BATCH, local_steps=3 * PER_PASS))
    assert torch.equal(by_steps.params, by_epochs.params)
    assert by_steps.epoch_losses == by_epochs.epoch_losses and by_steps.metrics == by_epochs.metrics


def test_the_round_config_sets_k_for_one_task() -> None:
    steps: list[int] = []
    client = Client(0, np.arange(N), batch_size=BATCH, optimizer=_counting_sgd(steps), local_steps=9)
    assert _fit(client, {"local_steps": 4}).metrics["local_steps"] == 4 and len(steps) == 4
    assert client.local_steps == 9  # the client is unchanged


def test_a_client_without_examples_takes_no_step() -> None:
    update = _fit(Client(0, np.arange(0), batch_size=BATCH, local_steps=5))
    assert update.metrics["local_steps"] == 0 and update.epoch_losses == ()
    assert torch.equal(update.params, torch.zeros_like(update.params))


def test_bad_local_steps_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"^client\.local_steps must be an integer >= 1") as error:
        Client(0, np.arange(N), local_steps=0)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=r"^client\.local_steps: client=dpsgd") as error:
        DPSGDClient(0, np.arange(N), local_steps=3)
    assert "\n" not in str(error.value)


class OwnEpochs(Client):
    """A client with an epoch loop of its own, which cannot stop after K batches."""

    def _run_epoch(self, *args: Any) -> float:
        return 0.0


def test_a_client_with_its_own_epoch_loop_refuses_local_steps() -> None:
    with pytest.raises(TypeError, match="client.local_steps: OwnEpochs has its own epoch loop") as error:
        _fit(OwnEpochs(0, np.arange(N), local_steps=2))
    assert "\n" not in str(error.value)
    assert _fit(OwnEpochs(0, np.arange(N), batch_size=BATCH)).epoch_losses == (0.0,)  # its epochs still run


# --- the server: stragglers, FedNova and SCAFFOLD -----------------------------------------------------------------


class Seen:
    """Mixed into a strategy: notes (round, client, reported local steps, lr) of every update it aggregates."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[int, int, float, float]] = []

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Any) -> torch.Tensor:
        self.seen += [(round_num, u.client_id, u.metrics["local_steps"], u.metrics["lr"]) for u in updates]
        return super().aggregate(round_num, global_params, updates)  # type: ignore[misc]


class SeenFedNova(Seen, FedNova):
    pass


class SeenFedAvg(Seen, FedAvg):
    pass


def _server(strategy: Any, *, k: int | None = 6, fraction: float = 0.5, clock: Any = None) -> Server:
    data = federate(
        synthetic(num_devices=8, min_size=20, max_size=40, seed=2), natural, client_test_fraction=0.2, seed=0
    )
    clients = make_clients(data, functools.partial(Client, batch_size=8, local_steps=k))
    return Server(
        model_factory=functools.partial(LogisticRegression, (60,), 10),
        federation=Federation(clients=clients, train_data=data.train, test_data=data.test),
        strategy=strategy,
        executor=SerialExecutor(),
        schedule=Schedule(num_rounds=3, clients_per_round=8),
        seed=5,
        logger=RunLogger(None, progress=False),
        stages=Stages(stragglers=Stragglers(fraction=fraction, epochs=1, seed=5), clock=clock),
    )


def test_a_straggler_does_a_uniform_share_of_its_k_steps_in_the_rounds_epochs_would_pick() -> None:
    parts = _server(FedProx(mu=0.1)).parts
    by_epochs = Stragglers(fraction=0.5, epochs=6, seed=5)  # the same draw with E = K = 6
    shares: dict[int, int] = {}
    for round_num in range(1, 30):
        for cid in range(8):
            config = parts.client_config(round_num, cid)
            assert "epochs" not in config  # stragglers.epochs=1 is not read
            assert config.get("local_steps") == by_epochs.epochs_for(round_num, cid)
            assert parts.straggles(round_num, cid) == ("local_steps" in config)
            if "local_steps" in config:
                shares[config["local_steps"]] = shares.get(config["local_steps"], 0) + 1
    assert set(shares) == {1, 2, 3, 4, 5} and 0.3 < sum(shares.values()) / (29 * 8) < 0.7
    assert not any(_server(FedProx(), k=1).parts.straggles(r, c) for r in range(1, 30) for c in range(8))


def test_fednova_reads_each_clients_k_and_its_stragglers_share() -> None:
    server = _server(SeenFedNova())
    server.run()
    seen = server.strategy.seen
    assert len(seen) == 3 * 8 and {steps for *_, steps, _ in seen} > {6.0}  # some stragglers did fewer than 6
    for round_num, cid, steps, _ in seen:
        assert steps == server.parts.client_config(round_num, cid).get("local_steps", 6)


def test_fedavg_drops_the_stragglers_of_local_steps() -> None:
    server = _server(SeenFedAvg())
    server.run()
    aggregated = {(r, c) for r, c, *_ in server.strategy.seen}
    expected = {(r, c) for r in range(1, 4) for c in range(8) if not server.parts.straggles(r, c)}
    assert aggregated == expected and len(expected) < 3 * 8


def test_scaffold_divides_by_the_k_steps_and_the_rate_of_the_task() -> None:
    """c_i⁺ = c_i − c + (x − y_i) / (K η): with c = c_i = 0 (a first round), (x − y_i) / (K η) with the task's own K
    and η."""
    client = Client(0, np.arange(N), batch_size=BATCH, local_steps=5)
    model = LogisticRegression((3,), N)
    x = flatten(model)
    local = Scaffold().local_training()
    assert local is not None
    state: dict[str, Any] = {}
    config = {"lr": 0.03, "local_steps": 7}
    update = client.fit(model, _data(), config=config, generator=torch.Generator().manual_seed(0), local=local)
    assert update.metrics["local_steps"] == 7 and update.metrics["lr"] == 0.03
    local.update_state(state, config, x, update)
    assert torch.equal(state[STATE_KEY], (x - update.params) / (7 * 0.03))


def test_the_simulated_clock_refuses_local_steps_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"^clock: .*client\.local_steps=6") as error:
        _server(FedAvg(), clock=sampled_clock(num_clients=8, seed=0))
    assert "\n" not in str(error.value)
