"""fedsim.client.adapters: user objects with train(state_dict) run as clients, the same under every executor."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from fedsim.client.adapters import StateDictClient, accepted_extras, from_user_objects, no_shared_data
from fedsim.core.params import flatten
from fedsim.core.types import ClientFailure, ClientUpdate, FitTask
from fedsim.data.tensor_data import TensorData
from fedsim.executor import ProcessExecutor, SerialExecutor
from fedsim.executor.base import Workload
from fedsim.observe.run_logger import RunLogger
from fedsim.server.server import RoundFailedError, RunResult, Server
from fedsim.server.settings import Federation, Schedule
from fedsim.strategy import FedAvg, FedProx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import user_objects  # noqa: E402  (workers import it by the same name: spawn copies sys.path)
from user_objects import BadUser, ConstantUser, NoisyUser, User, make_data, make_model  # noqa: E402


def users() -> list[User]:
    """Six users of different sizes; every other one is a NoisyUser (generator and state keywords)."""
    made = []
    for i in range(6):
        x, y = make_data(seed=i, n=12 + 5 * i)
        made.append((NoisyUser if i % 2 else User)(x, y, lr=0.1, epochs=2, batch_size=8))
    return made


def build(executor, clients, *, rounds: int = 3, per_round: int = 3, strategy=None, seed: int = 5) -> Server:
    x, y = make_data(seed=100, n=40)
    return Server(
        model_factory=make_model,
        federation=Federation(
            clients=clients,
            train_data=no_shared_data((user_objects.FEATURES,)),
            test_data=TensorData(x, y, num_classes=user_objects.CLASSES),
        ),
        strategy=strategy or FedAvg(),
        executor=executor,
        schedule=Schedule(num_rounds=rounds, clients_per_round=per_round),
        seed=seed,
        logger=RunLogger(None, progress=False),
    )


def run(executor, clients, **settings) -> RunResult:
    return build(executor, clients, **settings).run()


def test_serial_equals_process_bitwise() -> None:
    serial_clients = from_user_objects(users())
    serial = run(SerialExecutor(), serial_clients)
    process = run(ProcessExecutor(devices="cpu", workers=2), from_user_objects(users()))
    assert torch.equal(serial.params, process.params)
    assert not torch.equal(serial.params, build(SerialExecutor(), serial_clients).params)  # it trained
    assert {c["worker"] for r in process.history for c in r["clients"]} == {"w0", "w1"}
    for a, b in zip(serial.history, process.history, strict=True):
        assert [c["update_norm"] for c in a["clients"]] == [c["update_norm"] for c in b["clients"]]
    assert all(c.user.calls == 0 for c in serial_clients)  # put back after every task, as in a worker
    rounds = {}  # NoisyUser's counter in client state: 1, 2, ... for each client, on both executors
    for record in process.history:
        for row in record["clients"]:
            if "metrics" in row:
                rounds.setdefault(row["client_id"], []).append(row["metrics"]["rounds"])
    assert rounds and all(seen == list(range(1, len(seen) + 1)) for seen in rounds.values())
    assert process.history[-1]["eval/accuracy"] == serial.history[-1]["eval/accuracy"]


def test_same_seed_same_bits_other_seed_other_bits() -> None:
    first, again, other = (
        run(SerialExecutor(), from_user_objects(users()), rounds=1, seed=s).params for s in (5, 5, 6)
    )
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_fedavg_weights_by_the_returned_or_given_count() -> None:
    # client 0 returns (all ones, 1); client 1 returns all fours alone and was built with num_examples=3
    clients = [StateDictClient(0, ConstantUser(1.0, count=1)), StateDictClient(1, ConstantUser(4.0), num_examples=3)]
    result = run(SerialExecutor(), clients, rounds=1, per_round=2)
    assert torch.equal(result.params, torch.full_like(result.params, (1 * 1.0 + 3 * 4.0) / 4))  # 3.25
    assert [c["num_examples"] for c in result.history[0]["clients"]] == [1, 3]


@pytest.mark.parametrize(
    "mode, problem",
    [
        ("missing key", "missing keys ['3.bias']"),
        ("wrong shape", "'0.weight' has shape (2, 2), the model's has (16, 6)"),
        ("not a dict", "returned a list, not a state_dict"),
        ("no count", "returned no example count"),
    ],
)
def test_a_bad_return_is_a_failure_naming_client_and_problem(mode: str, problem: str) -> None:
    executor = SerialExecutor()
    clients = [StateDictClient(0, ConstantUser(1.0, 1)), StateDictClient(1, BadUser(mode))]
    executor.start(Workload(make_model, clients, no_shared_data((6,))))
    results = executor.fit(flatten(make_model()), [FitTask(0, 1, 0), FitTask(1, 1, 1)])
    assert isinstance(results[0], ClientUpdate)
    failure = results[1]
    assert isinstance(failure, ClientFailure) and not failure.fatal
    assert "client 1:" in failure.error and problem in failure.error, failure.error
    assert "\n" not in failure.error and "Traceback" in failure.traceback


def test_a_strategy_with_a_client_half_is_refused_by_name() -> None:
    with pytest.raises(RoundFailedError, match="client half ProximalTerm.*cannot apply"):
        clients = from_user_objects([ConstantUser(1.0, 1)] * 2)
        run(SerialExecutor(), clients, rounds=1, per_round=2, strategy=FedProx(mu=0.1))


def test_train_receives_only_the_extras_it_names() -> None:
    class Takes:
        def train(self, state_dict, *, seed, generator): ...  # noqa: ANN001, ANN202

    class TakesAll:
        def train(self, state_dict, **kwargs): ...  # noqa: ANN001, ANN003, ANN202

    assert accepted_extras(Takes().train) == ("seed", "generator")
    assert accepted_extras(TakesAll().train) == ("config", "generator", "seed", "state")
    assert accepted_extras(User(*make_data(0, 4)).train) == ()
    with pytest.raises(TypeError, match="client 3: int has no train"):
        StateDictClient(3, 7)


def test_train_gets_the_task_seed_and_config_or_refuses_a_config_it_cannot_take() -> None:
    class Echo:
        def train(self, state_dict, *, seed, config):  # noqa: ANN001, ANN202
            return state_dict, 1, {"seed": float(seed), "epochs": float(config["epochs"])}

    executor = SerialExecutor()
    executor.start(
        Workload(
            make_model, [StateDictClient(0, Echo()), StateDictClient(1, ConstantUser(1.0, 1))], no_shared_data((6,))
        )
    )
    echoed, refused = executor.fit(flatten(make_model()), [FitTask(c, 1, 1234, {"epochs": 3}) for c in (0, 1)])
    assert echoed.metrics == {"seed": 1234.0, "epochs": 3.0}
    assert (
        isinstance(refused, ClientFailure)
        and "client 1: the round's config ['epochs'] would be ignored" in refused.error
    )
