"""Ditto and FedRep: known answers of both client halves (one weight, one example, squared error, worked by hand),
the server rules, personal models scored by every-client evaluation, and worker processes equal to serial."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from builders import tiny_federation, tiny_server
from torch import nn

from fedsim.client.base import Client
from fedsim.client.evaluation import ClientEvaluation
from fedsim.core.params import ParamLayout, flatten, load_flat
from fedsim.core.types import ClientUpdate
from fedsim.data.tensor_data import TensorData
from fedsim.executor import ProcessExecutor, SerialExecutor, VmapExecutor
from fedsim.executor.vmap.optim import VmapUnsupportedError
from fedsim.models import MLP2NN
from fedsim.observe.run_logger import RunLogger
from fedsim.server.server import RunResult, Server
from fedsim.server.settings import Evaluation
from fedsim.strategy import Ditto, FedRep, Strategy
from fedsim.strategy.context import RunContext
from fedsim.strategy.ditto import STATE_KEY as DITTO_KEY
from fedsim.strategy.fedper import STATE_KEY as HEAD_KEY


class SquaredError(Client):
    """Loss ½ (output − label)², so that every step can be worked out by hand."""

    def per_example_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 0.5 * (logits[:, 0] - y.float()) ** 2


ONE_EXAMPLE = TensorData(x=torch.ones(1, 1), y=torch.tensor([3]), num_classes=4)  # x = 1, label 3


def _client() -> SquaredError:
    return SquaredError(0, [0], epochs=1, batch_size=1, optimizer=functools.partial(torch.optim.SGD, lr=0.1))


def _fit(model: nn.Module, strategy: Strategy, state: dict) -> ClientUpdate:
    return _client().fit(
        model, ONE_EXAMPLE, generator=torch.Generator().manual_seed(0), local=strategy.local_training(), state=state
    )


def test_ditto_client_half_known_answer_over_two_rounds() -> None:
    model, state = nn.Linear(1, 1, bias=False), {}
    ditto = Ditto(lam=0.5)
    load_flat(model, torch.tensor([1.0]))  # w⁰ = 1; loss ½ (w − 3)², gradient w − 3
    update = _fit(model, ditto, state)
    # global update: 1 − 0.1·(1 − 3) = 1.2; personal model starts at w⁰ = 1: 1 − 0.1·((1 − 3) + 0.5·(1 − 1)) = 1.2
    assert update.params.tolist() == pytest.approx([1.2]) and state[DITTO_KEY].tolist() == pytest.approx([1.2])
    assert update.metrics["personal_train_loss"] == pytest.approx(2.0)  # ½ (1 − 3)², before the step
    load_flat(model, torch.tensor([2.0]))  # next round's global model w¹ = 2
    update = _fit(model, ditto, state)
    # global: 2 − 0.1·(2 − 3) = 2.1; personal: 1.2 − 0.1·((1.2 − 3) + 0.5·(1.2 − 2)) = 1.2 + 0.22 = 1.42
    assert update.params.tolist() == pytest.approx([2.1]) and state[DITTO_KEY].tolist() == pytest.approx([1.42])
    personal = nn.Linear(1, 1, bias=False)
    assert ditto.local_training().personalise(personal, state) and flatten(personal).tolist() == pytest.approx([1.42])
    assert not ditto.local_training().personalise(personal, {})


def test_ditto_with_no_pull_trains_a_local_model_and_the_server_is_fedavg() -> None:
    model, state = nn.Linear(1, 1, bias=False), {DITTO_KEY: torch.tensor([0.0])}
    load_flat(model, torch.tensor([5.0]))
    _fit(model, Ditto(lam=0.0), state)
    assert state[DITTO_KEY].tolist() == pytest.approx([0.3])  # 0 − 0.1·(0 − 3): the global model plays no part
    updates = [ClientUpdate(0, 1, torch.tensor([1.0]), 1), ClientUpdate(1, 1, torch.tensor([5.0]), 3)]
    assert Ditto().aggregate(1, torch.zeros(1), updates).tolist() == [4.0]  # (1·1 + 3·5) / 4


def _two_layers() -> nn.Module:
    return nn.Sequential(nn.Linear(1, 1, bias=False), nn.Linear(1, 1, bias=False))  # output h·b·x: body b, head h


def _fedrep(head_epochs: int = 1) -> FedRep:
    strategy = FedRep(head_epochs=head_epochs)
    strategy.setup(
        RunContext(
            layout=ParamLayout.of(_two_layers()),
            num_clients=2,
            num_examples=(1, 1),
            clients_per_round=1,
            num_rounds=1,
            seed=0,
        )
    )
    return strategy


def test_fedrep_client_half_trains_the_head_first_then_the_body() -> None:
    model, state, strategy = _two_layers(), {}, _fedrep()
    assert strategy.split.names == ("1.weight",) and strategy.body == ("0.weight",)
    load_flat(model, torch.tensor([1.0, 1.0]))  # b = h = 1, x = 1, label 3
    update = _fit(model, strategy, state)
    # head epoch (b frozen): residual 1 − 3 = −2, ∂/∂h = −2·b = −2: h = 1 + 0.2 = 1.2
    # body epoch (h frozen): residual 1.2 − 3 = −1.8, ∂/∂b = −1.8·h = −2.16: b = 1 + 0.216 = 1.216
    assert update.params.tolist() == pytest.approx([1.216, 1.2]) and state[HEAD_KEY][
        "1.weight"
    ].flatten().tolist() == pytest.approx([1.2])
    assert update.metrics["head_train_loss"] == pytest.approx(2.0) and update.metrics["train_loss"] == pytest.approx(
        1.62
    )
    assert all(p.requires_grad for p in model.parameters())  # frozen only for the task
    load_flat(model, torch.tensor([2.0, -1.0]))  # next round: global body 2, global head −1 (never used by this client)
    update = _fit(model, strategy, state)
    # own head 1.2: residual 2.4 − 3 = −0.6, ∂/∂h = −1.2: h = 1.32;
    # then residual 2.64 − 3 = −0.36, ∂/∂b = −0.4752: b = 2.04752
    assert update.params.tolist() == pytest.approx([2.04752, 1.32])


def test_fedrep_server_averages_the_body_and_keeps_the_global_head() -> None:
    updates = [ClientUpdate(0, 1, torch.tensor([1.0, 7.0]), 1), ClientUpdate(1, 1, torch.tensor([5.0, 9.0]), 3)]
    assert _fedrep().aggregate(1, torch.tensor([0.0, -1.0]), updates).tolist() == [4.0, -1.0]


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: Ditto(lam=-1), "strategy.lam"),
        (lambda: Ditto(personal_epochs=0), "strategy.personal_epochs"),
        (lambda: FedRep(head_epochs=0), "strategy.head_epochs"),
    ],
)
def test_bad_parameters_name_the_field(make, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=field):
        make()


def _run(strategy: Strategy, executor) -> tuple[RunResult, Server]:  # type: ignore[no-untyped-def]
    server = tiny_server(
        tiny_federation(10, max_size=50, seed=4, client_test_fraction=0.25),
        model=functools.partial(MLP2NN, (60,), 10, hidden=16),
        client=functools.partial(Client, batch_size=8),
        strategy=strategy,
        executor=executor,
        seed=1,
        logger=RunLogger(None, progress=False),
        evaluation=Evaluation(clients=ClientEvaluation("all")),
    )
    return server.run(), server


@pytest.mark.parametrize("make", [lambda: Ditto(lam=0.1), lambda: FedRep(head_epochs=2)], ids=["ditto", "fedrep"])
def test_worker_processes_equal_serial_personal_models_included(make) -> None:  # type: ignore[no-untyped-def]
    (serial, serial_server), (process, process_server) = (
        _run(make(), SerialExecutor()),
        _run(make(), ProcessExecutor(devices="cpu", workers=2)),
    )
    assert torch.equal(serial.params, process.params)
    clients = serial_server.parts.client_states.clients()
    assert clients == process_server.parts.client_states.clients() and len(clients) >= 6
    for cid in clients:
        ours, theirs = serial_server.parts.client_states.get(cid), process_server.parts.client_states.get(cid)
        assert ours.keys() == theirs.keys() and all(torch.equal(*pair) for pair in _tensors(ours, theirs))
    evaluated = [{k: v for k, v in r.items() if k.startswith("eval")} for r in serial.history]
    assert evaluated == [{k: v for k, v in r.items() if k.startswith("eval")} for r in process.history]
    assert serial.history[-1]["eval_personal/personalised"] == len(clients)
    assert np.isfinite(serial.history[-1]["eval_personal/accuracy_p10"])


def _tensors(a: dict, b: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
    pairs = []
    for key in a:
        if isinstance(a[key], dict):
            pairs += _tensors(a[key], b[key])
        else:
            pairs.append((a[key], b[key]))
    return pairs


@pytest.mark.parametrize("strategy, hook", [(Ditto(), "after_training"), (FedRep(), "end_task")])
def test_vmap_refuses_them_in_one_line(strategy: Strategy, hook: str) -> None:
    strategy.setup(
        RunContext(
            layout=ParamLayout.of(_two_layers()),
            num_clients=2,
            num_examples=(1, 1),
            clients_per_round=1,
            num_rounds=1,
            seed=0,
        )
    )
    from fedsim.executor.base import Workload

    with pytest.raises(VmapUnsupportedError, match=rf"\.{hook}\).*use executor=process"):
        VmapExecutor().check(Workload(_two_layers, [_client()], ONE_EXAMPLE, local=strategy.local_training()))
