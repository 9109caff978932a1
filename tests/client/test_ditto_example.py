"""experiments/ditto: a personalised client (Ditto) outside the fedsim package, its personal model in client state.

Known answers for the personal step, the global copy equal to FedAvg's, the personal model carried over
rounds by the server's client-state store, then the README's command run as a user would (from the repository
root, ``PYTHONPATH=experiments/ditto``), serial against two worker processes.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from builders import tiny_federation, tiny_server
from cli_runner import run_cli
from torch import nn

from fedsim.client.base import Client
from fedsim.core.checkpoint import read_verified
from fedsim.core.params import flatten, load_flat
from fedsim.core.seeding import task_seed
from fedsim.data.tensor_data import TensorData
from fedsim.executor import client_guard
from fedsim.models import LogisticRegression
from fedsim.server.server import Server

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "experiments" / "ditto"
sys.path.insert(0, str(EXAMPLE))

from ditto import DittoClient  # noqa: E402

DITTO = ["client._target_=ditto.DittoClient", "+client.lam=0.1"]
PROCESS = ["executor=process", "executor.devices=cpu", "executor.workers=2"]


# --- known answers -------------------------------------------------------------------------------------------------


def test_personal_step_known_answer() -> None:
    # v: W = (1, 1)ᵀ, b = 0; w (the round's global model): W = (0.5, -1)ᵀ, b = 0. One example x = 1, y = 0:
    # logits (1, 1), softmax (1/2, 1/2), so ∇_W L = (p − e₀)·x = (-1/2, 1/2)ᵀ, ∇_b L = (-1/2, 1/2), L = ln 2.
    # λ(v − w) = 1/4·(1/2, 2)ᵀ for W, 0 for b. SGD with η = 1/2: v − η(∇L(v) + λ(v − w)) =
    # W: 1 − ½(−½ + ⅛) = 1.1875, 1 − ½(½ + ½) = 0.5; b: 0 − ½(−½) = 0.25, −0.25
    model = nn.Linear(1, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0], [1.0]]))
        model.bias.zero_()
    anchor = [torch.tensor([[0.5], [-1.0]]), torch.zeros(2)]
    client = DittoClient(0, [0], lam=0.25)
    loss = client.personal_step(
        model, torch.optim.SGD(model.parameters(), lr=0.5), anchor, torch.tensor([[1.0]]), torch.tensor([0])
    )
    assert float(loss) == pytest.approx(math.log(2), abs=1e-7)
    assert torch.equal(model.weight.detach(), torch.tensor([[1.1875], [0.5]]))
    assert torch.equal(model.bias.detach(), torch.tensor([0.25, -0.25]))


def test_personal_step_with_lam_zero_is_a_plain_sgd_step() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    ditto_model, plain_model = nn.Linear(3, 2), nn.Linear(3, 2)
    plain_model.load_state_dict(ditto_model.state_dict())
    anchor = [torch.randn_like(p) for p in ditto_model.parameters()]  # ignored when λ = 0
    DittoClient(0, [0], lam=0.0).personal_step(
        ditto_model, torch.optim.SGD(ditto_model.parameters(), lr=0.1), anchor, x, y
    )
    Client(0, [0]).train_step(plain_model, torch.optim.SGD(plain_model.parameters(), lr=0.1), x, y)
    assert torch.equal(flatten(ditto_model), flatten(plain_model))


@pytest.mark.parametrize(
    "kwargs", [{"lam": -1.0}, {"lam": True}, {"lam": "0.1"}, {"personal_epochs": 0}, {"personal_epochs": 1.5}]
)
def test_bad_parameters_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"client\.(lam|personal_epochs)"):
        DittoClient(0, [0], **kwargs)


def _tiny_data() -> TensorData:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(30, 4, generator=generator)
    return TensorData(x, (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long(), num_classes=4)


def _fit(client: Client, start: torch.Tensor, state: dict[str, Any], seed: int = 7) -> tuple[torch.Tensor, Any]:
    model = nn.Linear(4, 4)
    load_flat(model, start)
    update = client.fit(model, _tiny_data(), generator=torch.Generator().manual_seed(seed), round_num=1, state=state)
    return update.params, update


def test_fit_returns_fedavgs_global_copy_and_keeps_the_personal_model_in_state() -> None:
    start = flatten(nn.Linear(4, 4))
    kwargs = {"epochs": 2, "batch_size": 4}
    ditto = DittoClient(0, np.arange(20), np.arange(20, 30), lam=0.5, **kwargs)
    before = client_guard.snapshot(ditto)
    state: dict[str, Any] = {}
    params, update = _fit(ditto, start, state)
    assert client_guard.changed_attribute(ditto, before) is None  # nothing set on self
    plain, _ = _fit(Client(0, np.arange(20), np.arange(20, 30), **kwargs), start, {})
    assert torch.equal(params, plain)  # the global copy trains exactly as FedAvg's client does
    assert update.state is state and set(state) == {"personal"}
    assert state["personal"].shape == start.shape and not torch.equal(state["personal"], params)
    assert {"personal_train_loss", "personal_loss", "personal_accuracy"} <= set(update.metrics)
    assert 0.0 <= update.metrics["personal_accuracy"] <= 1.0
    # a client without a local test split reports no personal test metrics (they would be NaN)
    _, no_test = _fit(DittoClient(0, np.arange(20), lam=0.5, **kwargs), start, {})
    assert "personal_train_loss" in no_test.metrics and "personal_loss" not in no_test.metrics


def test_second_round_starts_from_the_stored_personal_model() -> None:
    client = DittoClient(0, np.arange(20), np.arange(20, 30), lam=0.1, batch_size=5)
    start = flatten(nn.Linear(4, 4))
    first: dict[str, Any] = {}
    _fit(client, start, first, seed=1)
    carried, fresh = dict(first), {}
    _fit(client, start, carried, seed=2)
    _fit(client, start, fresh, seed=2)
    # same global weights, same seed: only the state differs, and v carries on from where round 1 left it
    assert float((carried["personal"] - fresh["personal"]).abs().max()) > 1e-3


def test_server_hands_each_client_its_committed_personal_model() -> None:
    """Through the real store: client 0's personal model after round 2 is round 2's training from the one it
    had after round 1 (replayed here by hand), not from the global weights."""
    data = tiny_federation(6)

    def server(rounds: int) -> Server:
        client = functools.partial(DittoClient, lam=0.5, batch_size=8)
        return tiny_server(data, client=client, num_rounds=rounds, clients_per_round=6, seed=5)

    one, two = server(1), server(2)
    after_round_1 = one.run().params
    two.run()
    state_1, state_2 = one.parts.client_states.get(0), two.parts.client_states.get(0)
    assert set(state_1) == set(state_2) == {"personal"}

    def replay(state: dict[str, Any]) -> torch.Tensor:
        model = LogisticRegression((60,), 10)
        load_flat(model, after_round_1)
        generator = torch.Generator().manual_seed(task_seed(5, 2, 0))
        two.clients[0].fit(model, data.train, config={}, generator=generator, round_num=2, state=state)
        return state["personal"]

    assert torch.allclose(replay(dict(state_1)), state_2["personal"], rtol=0, atol=1e-6)
    assert float((replay({}) - state_2["personal"]).abs().max()) > 1e-3


# --- the README's command ------------------------------------------------------------------------------------------


def _run(args: list[str], run_dir: Path, rounds: int = 3) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``PYTHONPATH=experiments/ditto python -m fedsim ARGS`` from the repository root, in this process."""
    proc = run_cli(
        [*args, f"num_rounds={rounds}", "logger=quiet", f"hydra.run.dir={run_dir}"], cwd=ROOT, pythonpath=[EXAMPLE]
    )
    return proc, run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[dict[str, Any]], Path]]:
    base = tmp_path_factory.mktemp("ditto")
    cases = {"fedavg": [], "ditto": DITTO, "ditto_process": DITTO + PROCESS}
    results = {name: _run(args, base / name) for name, args in cases.items()}
    records = {}
    for name, (proc, run_dir) in results.items():
        assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
        assert "final test accuracy" in proc.stdout
        records[name] = ([json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()], run_dir)
    return records


def test_every_round_reports_the_personal_models(runs: dict[str, tuple[list[dict[str, Any]], Path]]) -> None:
    records, _ = runs["ditto"]
    assert [r["round"] for r in records] == [1, 2, 3]
    for record in records:
        assert 0.0 <= record["fit/personal_accuracy"] <= 1.0
        assert math.isfinite(record["fit/personal_loss"]) and math.isfinite(record["fit/personal_train_loss"])
        assert all(math.isfinite(c["metrics"]["personal_loss"]) for c in record["clients"])
    assert "fit/personal_accuracy" not in runs["fedavg"][0][0]


def test_the_global_model_is_fedavgs(runs: dict[str, tuple[list[dict[str, Any]], Path]]) -> None:
    # the update sent back is the global copy, trained as FedAvg's clients train: the same global model, bit for bit
    keys = ("train/loss", "eval/loss", "eval/accuracy", "eval_global/loss")
    assert [[r[k] for k in keys] for r in runs["ditto"][0]] == [[r[k] for k in keys] for r in runs["fedavg"][0]]


def test_worker_processes_give_the_serial_personal_models(runs: dict[str, tuple[list[dict[str, Any]], Path]]) -> None:
    serial, process = runs["ditto"][0], runs["ditto_process"][0]
    assert [r["fit/personal_loss"] for r in process] == [r["fit/personal_loss"] for r in serial]
    per_client = lambda records: [(c["client_id"], c["metrics"]) for r in records for c in r["clients"]]  # noqa: E731
    assert per_client(process) == per_client(serial)
    assert {c["worker"] for r in process for c in r["clients"]} == {"w0", "w1"}


def test_personal_models_are_checkpointed_client_state(runs: dict[str, tuple[list[dict[str, Any]], Path]]) -> None:
    records, run_dir = runs["ditto"]
    entries = sorted((run_dir / "checkpoints" / "client_state").glob("*/c*-r*.state"))
    sampled = {c["client_id"] for r in records for c in r["clients"]}
    assert {int(p.name[1:].split("-")[0]) for p in entries} == sampled
    state = read_verified(entries[0], "client state")
    assert set(state) == {"personal"} and state["personal"].shape == (60 * 10 + 10,)


def test_resume_from_a_kept_checkpoint_restores_the_personal_models(tmp_path: Path) -> None:
    # checkpoints after rounds 2 and 4; a new run directory continuing from round 2 must train every client's
    # personal model from the version it had after round 2, not from its newest one (round 3 or 4) or none
    args = DITTO + ["checkpoint_every=2"]
    full, full_dir = _run(args, tmp_path / "full", rounds=4)
    assert full.returncode == 0, full.stderr[-3000:]
    resumed, resumed_dir = _run(
        args + [f"resume={full_dir / 'checkpoints' / 'round-000002.ckpt'}"], tmp_path / "resumed", rounds=4
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    read = lambda run_dir: [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    personal = lambda records: [(r["round"], r["fit/personal_loss"]) for r in records]  # noqa: E731
    assert personal(read(resumed_dir)) == personal(read(full_dir))
    assert [r["round"] for r in read(resumed_dir)] == [1, 2, 3, 4]


def test_vmap_refuses_the_custom_fit(tmp_path: Path) -> None:
    proc, _ = _run(DITTO + ["executor=vmap"], tmp_path)
    assert proc.returncode != 0
    assert "executor=vmap cannot run DittoClient.fit" in proc.stderr
