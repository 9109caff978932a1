"""A run on a :class:`~fedsim.client.federation.Population` of 20,000 devices resumes exactly (issue #35), and the
stages that used to iterate every client (an attack, the server's root data) leave the population's clients unbuilt.

The runs are issue #35's command at 20,000 devices (Synthetic, ten examples a device), built as ``python -m fedsim``
builds them (:func:`fedsim.cli.run.build_server`), serial, four rounds, a checkpoint every round. A run is stopped
after round 2 (:meth:`~fedsim.server.server.Server.request_stop`, what Ctrl-C does), resumed from its run directory
and must end bitwise equal to the uninterrupted run, with the same metrics; so must a resume from the uninterrupted
run's own round-2 checkpoint, whose disk store already holds the states of rounds 3 and 4.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fedsim.cli.run as run
from fedsim.attacks.stage import AttackStage
from fedsim.client.base import Client
from fedsim.client.federation import Population, training_rows
from fedsim.core.checkpoint import load_latest
from fedsim.data.shares import Shares
from fedsim.data.tensor_data import TensorData
from fedsim.server.server import RunResult

DEVICES = 20_000
ISSUE = [
    f"data.num_devices={DEVICES}",
    "+data.size_mean_log=0",
    "+data.size_sigma_log=0",
    "+data.min_size=9",
    "clients_per_round=10",
    "logger=quiet",
]
ROUNDS = 4
MEASURED = ("time/", "system/")  # wall-clock and memory readings differ between any two runs
SETTINGS = {"fedavg": ["strategy=fedavg"], "scaffold": ["strategy=scaffold", "state_store=disk"]}


def _cfg(strategy: str, *extra: str) -> Any:
    return run.compose(
        [*ISSUE, *SETTINGS[strategy], f"num_rounds={ROUNDS}", "eval_every=2", "checkpoint_every=1", *extra]
    )


def _scalars(result: RunResult) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not k.startswith(MEASURED)} for r in result.history]


def _stopped_after(round_stop: int, strategy: str, run_dir: Path) -> None:
    """Run ``strategy`` in ``run_dir`` and stop it, as Ctrl-C does, once round ``round_stop`` is done."""
    server = run.build_server(_cfg(strategy), run_dir)
    plain = server.run_round

    def round_then_stop(round_num: int) -> Any:
        done = plain(round_num)
        if round_num == round_stop:
            server.request_stop()
        return done

    server.run_round = round_then_stop  # type: ignore[method-assign]
    result = server.run()
    assert result.stop_reason == f"interrupted after round {round_stop}"
    assert load_latest(run_dir / "checkpoints")[1]["round"] == round_stop


@pytest.mark.slow  # three runs of 20,000 devices: 4-9 s on the 2-core machine
@pytest.mark.parametrize("strategy", sorted(SETTINGS))
def test_a_stopped_run_of_20000_devices_resumes_bitwise(strategy: str, tmp_path: Path) -> None:
    server = run.build_server(_cfg(strategy), tmp_path / "full")
    assert isinstance(server.clients, Population) and len(server.clients) == DEVICES
    full = server.run()
    _stopped_after(2, strategy, tmp_path / "cut")
    resumed = run.build_server(_cfg(strategy, "resume=true"), tmp_path / "cut")
    assert resumed.start_round == 3
    again = resumed.run()
    assert torch.equal(again.params, full.params)
    assert _scalars(again) == _scalars(full) and len(full.history) == ROUNDS
    # the uninterrupted run's kept round-2 checkpoint: its store is ahead (rounds 3 and 4), the resume reads round 2's
    older = sorted((tmp_path / "full" / "checkpoints").glob("*round*2*"))
    assert len(older) == 1, sorted(p.name for p in (tmp_path / "full" / "checkpoints").iterdir())
    from_older = run.build_server(_cfg(strategy, f"resume={older[0]}"), tmp_path / "full")
    assert from_older.start_round == 3
    rerun = from_older.run()
    assert torch.equal(rerun.params, full.params)
    assert _scalars(rerun) == _scalars(full)


# --- stages that touch only the clients they need ---------------------------------------------------------------


class _Counted(Client):
    built = 0

    def __init__(self, **kwargs: Any) -> None:
        type(self).built += 1
        super().__init__(**kwargs)


def _population(devices: int) -> Population:
    sizes = np.arange(devices) % 5 + 1  # 1..5 training rows each, in one flat array
    train = Shares.from_sizes(np.arange(int(sizes.sum()))[::-1].copy(), sizes)
    return Population(functools.partial(_Counted, epochs=1), train, Shares.from_sizes(np.zeros(0), np.zeros(devices)))


def test_an_update_attack_leaves_the_population_unbuilt() -> None:
    from fedsim.attacks.model_poisoning import SignFlip

    population, _Counted.built = _population(1000), 0
    stage = AttackStage(SignFlip(fraction=0.1), num_clients=len(population), seed=0)
    data = TensorData(torch.zeros(15, 2), torch.zeros(15, dtype=torch.long), 2)
    train, clients = stage.poison_data(data, None, population)
    assert train is data and clients is population and _Counted.built == 0


def test_the_root_datas_pool_is_the_populations_rows_without_building_a_client() -> None:
    population, _Counted.built = _population(1000), 0
    rows = training_rows(population)
    assert _Counted.built == 0
    assert np.array_equal(rows, training_rows(list(population)))  # what every client holds, in client order


def test_a_cohort_builds_its_clients_only() -> None:
    """issue #35's point 5: scoring a cohort of 1,000 of 200,000 devices builds those 1,000 clients, no others."""
    from fedsim.client.evaluation import ClientEvaluation, eval_tasks

    devices, size = 200_000, 1000
    sizes = np.full(devices, 2)
    population = Population(
        functools.partial(_Counted, epochs=1),
        Shares.from_sizes(np.arange(2 * devices), sizes),
        Shares.from_sizes(np.arange(2 * devices), sizes),
    )
    _Counted.built = 0
    ids = ClientEvaluation(who="cohort", size=size).clients([], devices, seed=0)
    tasks = eval_tasks(5, ids, population)
    assert sorted(c for t in tasks for c in t.client_ids) == ids and len(ids) == size
    assert _Counted.built == size
