"""APFL, pFedMe, Per-FedAvg (both variants) and MOON, the per-batch algorithms, on every executor that runs Ditto:
serial, worker processes and Ray give bitwise the same global weights, client states (personal models, α, MOON's
previous models) and every-client scores (Per-FedAvg's step of adaptation included), and a run resumed from its
checkpoint (client states on disk) ends bitwise as the uninterrupted one."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from builders import tiny_federation, tiny_server

from fedsim.cli.run import compose, run_config
from fedsim.client.base import Client
from fedsim.client.evaluation import ClientEvaluation
from fedsim.executor import ProcessExecutor, RayExecutor, SerialExecutor
from fedsim.models import MLP2NN
from fedsim.observe.run_logger import RunLogger
from fedsim.server.settings import Evaluation
from fedsim.strategy import APFL, MOON, PerFedAvg, PFedMe, Strategy

ALGORITHMS = {
    "apfl": functools.partial(APFL, alpha=0.25, adapt_alpha=True),
    "pfedme": functools.partial(PFedMe, lam=1.0, personal_lr=0.05, inner_steps=2, beta=1.5),
    "perfedavg_fo": functools.partial(PerFedAvg, alpha=0.05, beta=0.02),
    "perfedavg_hf": functools.partial(PerFedAvg, alpha=0.05, variant="hf", delta=0.01),
    "moon": functools.partial(MOON, mu=2.0, temperature=0.5),
}
STATE_KEYS = {"apfl": "apfl_personal", "pfedme": "pfedme_personal", "moon": "moon_previous"}  # Per-FedAvg keeps none


def _run(strategy: Strategy, executor: Any) -> tuple[torch.Tensor, dict[int, Any], list[dict[str, float]]]:
    """Three rounds of 4 of 8 clients, every client scored with both models every round."""
    server = tiny_server(
        tiny_federation(8, max_size=50, seed=4, client_test_fraction=0.25),
        model=functools.partial(MLP2NN, (60,), 10, hidden=8),
        client=functools.partial(Client, batch_size=8),
        strategy=strategy,
        executor=executor,
        seed=1,
        logger=RunLogger(None, progress=False),
        evaluation=Evaluation(clients=ClientEvaluation("all")),
    )
    result = server.run()
    states = {cid: server.parts.client_states.get(cid) for cid in server.parts.client_states.clients()}
    return (
        result.params,
        states,
        [{k: v for k, v in r.items() if k.startswith(("eval", "fit"))} for r in result.history],
    )


def _same(a: object, b: object) -> bool:
    """Equal client states: the same keys, tensors equal bit for bit."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    return a == b


@pytest.fixture(scope="module")
def serial() -> dict[str, tuple[torch.Tensor, dict[int, Any], list[dict[str, float]]]]:
    return {name: _run(make(), SerialExecutor()) for name, make in ALGORITHMS.items()}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_worker_processes_equal_serial(name: str, serial: dict) -> None:
    params, states, history = _run(ALGORITHMS[name](), ProcessExecutor(devices="cpu", workers=2))
    assert torch.equal(params, serial[name][0]) and _same(states, serial[name][1]) and history == serial[name][2]
    if name in STATE_KEYS:
        assert len(states) >= 6 and all(STATE_KEYS[name] in state for state in states.values())
    if name != "moon":  # Per-FedAvg adapts every client at evaluation, the others those with a personal model
        assert history[-1]["eval_personal/personalised"] == (8 if name.startswith("perfedavg") else len(states))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_ray_equals_serial(name: str, serial: dict, local_ray: Any) -> None:
    params, states, history = _run(ALGORITHMS[name](), RayExecutor(workers=2, reuse_actors=True))
    assert torch.equal(params, serial[name][0]) and _same(states, serial[name][1]) and history == serial[name][2]


BASE = ["clients_per_round=4", "state_store=disk", "evaluate_clients=all", "logger.progress=false"]
BASE += ["logger.tensorboard=false", "+data.max_size=60", "data.num_devices=8"]


RESUMED = {
    "apfl": ["strategy=apfl", "strategy.adapt_alpha=true"],
    "pfedme": ["strategy=pfedme", "strategy.beta=1.5"],
    "perfedavg": ["strategy=perfedavg", "strategy.variant=hf", "model=mlp", "model.hidden=8", "client.local_steps=6"],
    "moon": ["strategy=moon", "strategy.mu=2", "model=mlp", "model.hidden=8"],
}


@pytest.mark.parametrize("name", sorted(RESUMED))
def test_a_resumed_run_is_bitwise_the_uninterrupted_one(name: str, tmp_path: Path) -> None:
    settings = [*RESUMED[name], *BASE]
    straight = run_config(compose([*settings, "num_rounds=3"]), run_dir=tmp_path / "straight")
    run_config(compose([*settings, "num_rounds=2"]), run_dir=tmp_path / "resumed")
    resumed = run_config(compose([*settings, "num_rounds=3", "resume=true"]), run_dir=tmp_path / "resumed")
    assert torch.equal(resumed.params, straight.params)
    assert _measured(resumed.history) == _measured(straight.history)
    assert ("eval_personal/accuracy_p10" in straight.history[-1]) == (name != "moon")


def _measured(history: list[dict[str, float]]) -> list[dict[str, float]]:
    """Every round's metrics but the wall-clock times and the process's memory (they differ between any two runs)."""
    return [{k: v for k, v in row.items() if not k.startswith(("time/", "system/"))} for row in history]
