"""``client.local_steps`` and ``client.lr_schedule`` under every executor: serial, worker processes and Ray give bitwise
the same weights, client states (SCAFFOLD's c_i, divided by each task's K · η_r) and metrics, with stragglers doing
fewer steps; ``executor=vmap`` runs them too, equal up to float32 rounding; and a run resumed from its checkpoint ends
bitwise as the uninterrupted one (the schedule is a function of the round: nothing is stored)."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from fedsim.cli.run import compose, run_config
from fedsim.client import LrSchedule
from fedsim.client.base import Client
from fedsim.client.federation import federate, make_clients
from fedsim.core.checkpoint import CheckpointError
from fedsim.data.partition import natural
from fedsim.data.synthetic import synthetic
from fedsim.executor import ProcessExecutor, RayExecutor, SerialExecutor, VmapExecutor
from fedsim.models import MLP2NN
from fedsim.observe.run_logger import RunLogger
from fedsim.server.server import Server
from fedsim.server.settings import Federation, Schedule, Stages
from fedsim.server.stragglers import Stragglers
from fedsim.strategy import Scaffold

K, ROUNDS = 7, 3
SCHEDULES = {"exponential": LrSchedule("exponential", gamma=0.6), "cosine": LrSchedule("cosine", min_lr=0.01)}


def _run(executor: Any, schedule: str) -> tuple[torch.Tensor, dict[int, Any], list[dict[str, Any]]]:
    """Three rounds of 4 of 8 clients (20-50 examples, batches of 8: K = 7 is 1 or 2 passes), half of them
    stragglers doing 1..6 steps, SCAFFOLD on top."""
    data = federate(
        synthetic(num_devices=8, min_size=20, max_size=50, seed=4), natural, client_test_fraction=0.25, seed=0
    )
    factory = functools.partial(
        Client,
        batch_size=8,
        local_steps=K,
        lr_schedule=SCHEDULES[schedule],
        optimizer=functools.partial(torch.optim.SGD, lr=0.05),
    )
    server = Server(
        model_factory=functools.partial(MLP2NN, (60,), 10, hidden=8),
        federation=Federation(clients=make_clients(data, factory), train_data=data.train, test_data=data.test),
        strategy=Scaffold(),
        executor=executor,
        schedule=Schedule(num_rounds=ROUNDS, clients_per_round=4),
        seed=1,
        logger=RunLogger(None, progress=False),
        stages=Stages(stragglers=Stragglers(fraction=0.5, seed=1)),
    )
    result = server.run()
    states = {cid: server.parts.client_states.get(cid) for cid in server.parts.client_states.clients()}
    return result.params, states, [_measured(r) for r in result.history]


def _measured(record: dict[str, Any]) -> dict[str, Any]:
    """A round's metrics and client rows without wall-clock times, memory and worker names."""
    clients = [{k: v for k, v in c.items() if k not in ("worker", "device")} for c in record.get("clients", [])]
    return {**{k: v for k, v in record.items() if not k.startswith(("time/", "system/", "clients"))}, "rows": clients}


def _same(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    return a == b


@pytest.fixture(scope="module")
def serial() -> dict[str, Any]:
    return {name: _run(SerialExecutor(), name) for name in SCHEDULES}


def test_the_serial_runs_do_k_steps_and_stragglers_fewer(serial: dict[str, Any]) -> None:
    rows = [row for record in serial["exponential"][2] for row in record["rows"]]
    full = [math.ceil(K / math.ceil(row["num_examples"] / 8)) for row in rows]  # the passes that K = 7 batches need
    passes = [len(row["epoch_losses"]) for row in rows]
    assert all(p <= f for p, f in zip(passes, full, strict=True)) and passes != full  # stragglers do fewer
    assert len(set(full)) > 1  # clients of different sizes need different numbers of passes
    assert all(any(k.startswith("scaffold") for k in state) for state in serial["exponential"][1].values())


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_worker_processes_equal_serial(schedule: str, serial: dict[str, Any]) -> None:
    params, states, history = _run(ProcessExecutor(devices="cpu", workers=2), schedule)
    assert torch.equal(params, serial[schedule][0]) and _same(states, serial[schedule][1])
    assert history == serial[schedule][2]


@pytest.mark.slow
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_ray_equals_serial(schedule: str, serial: dict[str, Any], local_ray: Any) -> None:
    params, states, history = _run(RayExecutor(workers=2, reuse_actors=True), schedule)
    assert torch.equal(params, serial[schedule][0]) and _same(states, serial[schedule][1])
    assert history == serial[schedule][2]


def test_vmap_equals_serial_up_to_float32_rounding(serial: dict[str, Any]) -> None:
    """vmap sums in other orders: along 3 rounds × 7 dependent steps, sums of up to 60 features each perturbed by about
    sqrt(60) float32 roundoffs (the bound of tests/executor/vmap/test_vmap.py)."""
    params, _, history = _run(VmapExecutor(chunk_size=3), "exponential")
    expected = serial["exponential"][0]
    assert float((params - expected).norm() / expected.norm()) <= ROUNDS * K * math.sqrt(60) * 2.0**-24
    passes = [[len(row["epoch_losses"]) for row in record["rows"]] for record in history]
    assert passes == [[len(row["epoch_losses"]) for row in record["rows"]] for record in serial["exponential"][2]]


BASE = ["clients_per_round=4", "state_store=disk", "logger.progress=false", "logger.tensorboard=false"]
BASE += [
    "+data.max_size=60",
    "data.num_devices=8",
    "strategy=scaffold",
    "client.local_steps=5",
    "stragglers.fraction=0.5",
]


@pytest.mark.parametrize("schedule", ["client.lr_schedule.kind=step", "client.lr_schedule.kind=cosine"])
def test_a_resumed_run_is_bitwise_the_uninterrupted_one(schedule: str, tmp_path: Path) -> None:
    settings = [*BASE, schedule, "client.lr_schedule.step_rounds=1", "client.lr_schedule.gamma=0.5"]
    settings += ["client.lr_schedule.num_rounds=3"]  # cosine over 3 rounds whatever the run's length
    straight = run_config(compose([*settings, "num_rounds=3"]), run_dir=tmp_path / "straight")
    run_config(compose([*settings, "num_rounds=2"]), run_dir=tmp_path / "resumed")
    resumed = run_config(compose([*settings, "num_rounds=3", "resume=true"]), run_dir=tmp_path / "resumed")
    assert torch.equal(resumed.params, straight.params)
    assert [_measured(r) for r in resumed.history] == [_measured(r) for r in straight.history]


def test_extending_a_cosine_over_the_runs_rounds_is_refused_in_one_line(tmp_path: Path) -> None:
    settings = [*BASE, "client.lr_schedule.kind=cosine"]
    run_config(compose([*settings, "num_rounds=2"]), run_dir=tmp_path / "run")
    with pytest.raises(CheckpointError, match=r"num_rounds \(2 -> 3\)") as error:
        run_config(compose([*settings, "num_rounds=3", "resume=true"]), run_dir=tmp_path / "run")
    assert "\n" not in str(error.value)
