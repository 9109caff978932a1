"""``client.lr_schedule``: the learning rate of every round, a pure function of the round. Known answers of each kind
against its closed form (numbers worked by hand below) and against PyTorch's schedulers stepped once per round; the
rate the server sends in every task's config (on the strategy's own rate too), the rate the update reports, the
one-line refusals of bad values, and num_rounds made a computation setting for a cosine over the run's rounds."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import pytest
import torch

from fedsim.cli.config import ConfigError
from fedsim.cli.run import build_server, compose
from fedsim.client import LrSchedule
from fedsim.client.base import Client
from fedsim.client.federation import federate, make_clients
from fedsim.data.partition import natural
from fedsim.data.synthetic import synthetic
from fedsim.executor import SerialExecutor
from fedsim.models import LogisticRegression
from fedsim.observe.run_logger import RunLogger
from fedsim.server.resume_check import computation_settings
from fedsim.server.server import Server
from fedsim.server.settings import Federation, Schedule
from fedsim.strategy import FedAvg

ETA = 0.1
# rounds 1..6 (t = r − 1 = 0..5), worked by hand:
#   exponential γ = 0.5:            0.1 · 0.5^t
#   step γ = 0.1, s = 2:            0.1 · 0.1^⌊t/2⌋
#   cosine T = 4, η_min = 0.02:     0.02 + 0.08 · (1 + cos(π t / 4)) / 2, then 0.02 after t = T
COS45 = math.sqrt(2) / 2
KNOWN = {
    "constant": (LrSchedule(), [0.1] * 6),
    "exponential": (LrSchedule("exponential", gamma=0.5), [0.1, 0.05, 0.025, 0.0125, 0.00625, 0.003125]),
    "step": (LrSchedule("step", gamma=0.1, step_rounds=2), [0.1, 0.1, 0.01, 0.01, 0.001, 0.001]),
    "cosine": (
        LrSchedule("cosine", min_lr=0.02, num_rounds=4),
        [0.1, 0.02 + 0.04 * (1 + COS45), 0.06, 0.02 + 0.04 * (1 - COS45), 0.02, 0.02],
    ),
}


@pytest.mark.parametrize("kind", sorted(KNOWN))
def test_each_schedule_follows_its_closed_form(kind: str) -> None:
    schedule, rates = KNOWN[kind]
    got = [schedule.lr(ETA, r) for r in range(1, 7)]
    assert got == pytest.approx(rates, rel=1e-15, abs=0)  # a few roundings of float64 arithmetic apart


def _torch_rates(kind: str) -> list[float]:
    """The rate PyTorch's scheduler gives before each of rounds 1..4 when stepped once per round."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=ETA)
    scheduler = {
        "constant": lambda: torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: 1.0),
        "exponential": lambda: torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.5),
        "step": lambda: torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.1),
        "cosine": lambda: torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4, eta_min=0.02),
    }[kind]()
    rates = []
    for _ in range(5):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize("kind", sorted(KNOWN))
def test_each_schedule_is_pytorchs_stepped_once_a_round(kind: str) -> None:
    # PyTorch multiplies recursively (a rounding per step): 5 steps of float64 rounding, 2⁻⁵³ each, stay under 1e-14
    assert [KNOWN[kind][0].lr(ETA, r) for r in range(1, 6)] == pytest.approx(_torch_rates(kind), rel=1e-14, abs=0)


def test_cosine_spans_the_runs_rounds_unless_it_has_its_own() -> None:
    # T = 4 from the run, t = 2: 0.1 · (1 + cos(π/2)) / 2 = 0.05; its own T = 8 wins: 0.1 · (1 + cos(π/4)) / 2
    assert LrSchedule("cosine").lr(ETA, 3, num_rounds=4) == pytest.approx(0.05, rel=1e-15)
    assert LrSchedule("cosine", num_rounds=8).lr(ETA, 3, num_rounds=4) == pytest.approx(0.05 * (1 + COS45), rel=1e-15)
    with pytest.raises(ValueError, match="needs num_rounds"):
        LrSchedule("cosine").lr(ETA, 3)


# --- the rate of every task, from the server ------------------------------------------------------------------------


class Rates(FedAvg):
    """FedAvg that notes the rate each aggregated update reports; ``lr`` (if set) is its clients' base rate."""

    def __init__(self, lr: float | None = None) -> None:
        self.lr, self.seen = lr, []

    def client_config(self, round_num: int, client_id: int) -> dict[str, Any]:
        return {} if self.lr is None else {"lr": self.lr}

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Any) -> torch.Tensor:
        self.seen += [(round_num, u.metrics["lr"]) for u in updates]
        return super().aggregate(round_num, global_params, updates)


def _server(schedule: LrSchedule, strategy: Rates, rounds: int = 4) -> Server:
    data = federate(
        synthetic(num_devices=6, min_size=20, max_size=30, seed=2), natural, client_test_fraction=0.2, seed=0
    )
    factory = functools.partial(
        Client, batch_size=8, optimizer=functools.partial(torch.optim.SGD, lr=ETA), lr_schedule=schedule
    )
    return Server(
        model_factory=functools.partial(LogisticRegression, (60,), 10),
        federation=Federation(clients=make_clients(data, factory), train_data=data.train, test_data=data.test),
        strategy=strategy,
        executor=SerialExecutor(),
        schedule=Schedule(num_rounds=rounds, clients_per_round=3),
        seed=1,
        logger=RunLogger(None, progress=False),
    )


def test_every_task_trains_with_its_rounds_rate() -> None:
    server = _server(LrSchedule("cosine", min_lr=0.02), Rates())  # T: the run's 4 rounds
    server.run()
    assert [lr for _, lr in server.strategy.seen] == [r for r in KNOWN["cosine"][1][:4] for _ in range(3)]
    assert server.parts.client_config(2, 0)["lr"] == KNOWN["cosine"][1][1]


def test_a_strategys_own_rate_is_the_base_the_schedule_scales() -> None:
    server = _server(LrSchedule("exponential", gamma=0.5), Rates(lr=0.4))
    assert [server.parts.client_config(r, 1)["lr"] for r in (1, 2, 3)] == [0.4, 0.2, 0.1]
    assert server.parts.client_config(3, 1, lr_round=1)["lr"] == 0.4  # FedBuff reads it at its start version + 1


def test_a_constant_schedule_sends_no_rate() -> None:
    assert "lr" not in _server(LrSchedule(), Rates()).parts.client_config(5, 0)


def test_the_client_applies_the_rate_it_is_sent() -> None:
    client = Client(0, np.arange(10), optimizer=functools.partial(torch.optim.SGD, lr=ETA))
    model = LogisticRegression((60,), 10)
    data = synthetic(num_devices=1, min_size=20, max_size=20, seed=0).train
    update = client.fit(model, data, config={"lr": 0.0125}, generator=torch.Generator().manual_seed(0))
    assert update.metrics["lr"] == 0.0125


# --- refusals and resume -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"kind": "linear"}, "client.lr_schedule.kind must be one of constant, exponential, step, cosine"),
        ({"gamma": 0.0}, "client.lr_schedule.gamma must be in (0, 1]"),
        ({"gamma": 1.5}, "client.lr_schedule.gamma must be in (0, 1]"),
        ({"step_rounds": 0}, "client.lr_schedule.step_rounds must be >= 1"),
        ({"min_lr": -0.1}, "client.lr_schedule.min_lr must be a finite number >= 0"),
        ({"num_rounds": 0}, "client.lr_schedule.num_rounds must be >= 1 or null"),
    ],
)
def test_bad_values_are_refused_in_one_line_naming_the_key(kwargs: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError) as error:
        LrSchedule(**kwargs)
    assert str(error.value).startswith(key) and "\n" not in str(error.value)
    override = [f"client.lr_schedule.{name}={value}" for name, value in kwargs.items()]
    with pytest.raises(ConfigError) as refused:
        build_server(compose(override))
    assert str(refused.value).startswith(key) and "\n" not in str(refused.value)


def test_every_key_composes_and_reaches_the_client() -> None:
    overrides = ["client.local_steps=5", "client.lr_schedule.kind=step", "client.lr_schedule.gamma=0.5"]
    overrides += [
        "client.lr_schedule.step_rounds=3",
        "client.lr_schedule.min_lr=0.001",
        "client.lr_schedule.num_rounds=7",
    ]
    for option in ("sgd", "adam"):
        server = build_server(compose([f"client={option}", *overrides, "num_rounds=2", "logger.progress=false"]))
        client = server.clients[0]
        assert client.local_steps == 5
        assert client.lr_schedule == LrSchedule("step", gamma=0.5, step_rounds=3, min_lr=0.001, num_rounds=7)
    dpsgd = build_server(compose(["client=dpsgd", "client.lr_schedule.kind=exponential", "logger.progress=false"]))
    assert dpsgd.clients[0].lr_schedule == LrSchedule("exponential")


def test_num_rounds_is_a_computation_setting_of_a_cosine_over_the_runs_rounds() -> None:
    flat = {"num_rounds": 30, "client.lr_schedule.kind": "cosine", "client.lr_schedule.num_rounds": None}
    assert computation_settings(flat)["num_rounds"] == 30  # every round's rate depends on it
    assert "num_rounds" not in computation_settings({**flat, "client.lr_schedule.num_rounds": 30})
    assert "num_rounds" not in computation_settings({**flat, "client.lr_schedule.kind": "step"})
