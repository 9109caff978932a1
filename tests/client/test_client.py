"""Client: local training from a given generator, overridable loss, per-round config, local evaluation."""

from __future__ import annotations

import functools
import math
import random
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from fedsim.client import Client, evaluate_indices
from fedsim.core.params import flatten, load_flat
from fedsim.core.types import ClientUpdate
from fedsim.data.tensor_data import TensorData
from fedsim.executor import SerialExecutor
from fedsim.models import LogisticRegression
from fedsim.server.server import Server
from fedsim.server.settings import Federation, Schedule
from fedsim.strategy import FedAvg

NUM_FEATURES, NUM_CLASSES = 4, 3


def _data(n: int = 60, seed: int = 0) -> TensorData:
    """Three well separated Gaussian blobs in 4-D (class k centred at 3·e_k)."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % NUM_CLASSES
    x = torch.randn(n, NUM_FEATURES, generator=gen) * 0.5
    x[torch.arange(n), y] += 3.0
    return TensorData(x, y, NUM_CLASSES)


def _model(seed: int = 0) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LogisticRegression((NUM_FEATURES,), NUM_CLASSES)


def _sgd(lr: float = 0.1) -> functools.partial:
    return functools.partial(torch.optim.SGD, lr=lr)


def _client(cls: type[Client] = Client, **kwargs: Any) -> Client:
    kwargs = {"epochs": 3, "batch_size": 8, "optimizer": _sgd(), **kwargs}
    return cls(0, np.arange(30), np.arange(30, 45), **kwargs)


def _fit(client: Client, seed: int = 7, model: nn.Module | None = None, **kwargs: Any) -> ClientUpdate:
    model = model if model is not None else _model()
    return client.fit(model, _data(), generator=torch.Generator().manual_seed(seed), **kwargs)


# --- what fit returns ----------------------------------------------------------------------------


def test_fit_returns_a_complete_update() -> None:
    model = _model()
    initial = flatten(model)
    update = _fit(_client(), model=model, round_num=5)
    assert isinstance(update, ClientUpdate)
    assert update.client_id == 0 and update.round_num == 5
    assert update.num_examples == 30
    assert update.params.shape == (sum(p.numel() for p in model.parameters()),) == initial.shape
    assert update.params.dtype == torch.float32 and update.params.device.type == "cpu"
    assert not torch.equal(update.params, initial)  # it trained
    assert torch.equal(update.params, flatten(model))  # ... the model it was given, in place
    assert len(update.epoch_losses) == 3 and all(math.isfinite(x) for x in update.epoch_losses)
    assert math.isfinite(update.metrics["train_loss"])
    assert update.metrics["train_loss"] == pytest.approx(sum(update.epoch_losses) / 3)
    assert update.metrics["local_steps"] == 3 * math.ceil(30 / 8)
    assert update.epoch_losses[-1] < update.epoch_losses[0]  # separable blobs: the loss goes down
    assert update.device == "cpu"


def test_update_params_are_a_copy_not_a_view_of_the_model() -> None:
    model = _model()
    update = _fit(_client(), model=model)
    kept = update.params.clone()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert torch.equal(update.params, kept)


def test_fit_uses_only_the_clients_own_rows() -> None:
    data = _data()
    poisoned = TensorData(data.x.clone(), data.y.clone(), NUM_CLASSES)
    poisoned.x[30:] = float("nan")  # rows the client does not own (its local test split and beyond)
    a = Client(0, np.arange(30), np.arange(30, 45), epochs=2, batch_size=8, optimizer=_sgd())
    upd_clean = a.fit(_model(), data, generator=torch.Generator().manual_seed(1))
    upd_poisoned = a.fit(_model(), poisoned, generator=torch.Generator().manual_seed(1))
    assert torch.equal(upd_clean.params, upd_poisoned.params)


# --- determinism and the global RNG --------------------------------------------------------------


def test_same_generator_seed_gives_bitwise_identical_params() -> None:
    a, b = _fit(_client(), seed=123), _fit(_client(), seed=123)
    assert torch.equal(a.params, b.params)
    assert a.epoch_losses == b.epoch_losses


def test_different_generator_seed_gives_different_params() -> None:
    assert not torch.equal(_fit(_client(), seed=1).params, _fit(_client(), seed=2).params)


def test_fit_does_not_touch_the_global_random_state() -> None:
    torch.manual_seed(2024)
    np.random.seed(2024)
    random.seed(2024)
    torch_state, np_state, py_state = torch.random.get_rng_state(), np.random.get_state(), random.getstate()
    _fit(_client())
    assert torch.equal(torch.random.get_rng_state(), torch_state)
    assert all(np.array_equal(x, y) for x, y in zip(np.random.get_state(), np_state, strict=True))
    assert random.getstate() == py_state


def test_fit_result_does_not_depend_on_the_global_random_state() -> None:
    torch.manual_seed(1)
    a = _fit(_client(), seed=5)
    torch.manual_seed(999)
    b = _fit(_client(), seed=5)
    assert torch.equal(a.params, b.params)


# --- customising local training ------------------------------------------------------------------


class L2Client(Client):
    """Adds a large L2 penalty to the cross-entropy (a user's override of ``loss``)."""

    def __init__(self, *args: Any, l2: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.l2 = l2

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        penalty = sum(p.pow(2).sum() for p in model.parameters())
        return super().loss(model, x, y) + self.l2 * penalty


def test_overriding_loss_changes_training() -> None:
    plain = _fit(_client(), seed=3)
    penalised = _fit(_client(L2Client, l2=1.0), seed=3)
    assert not torch.equal(plain.params, penalised.params)
    assert penalised.params.norm() < 0.5 * plain.params.norm()
    assert penalised.metrics["train_loss"] > plain.metrics["train_loss"]  # the reported loss is the overridden one


def test_overriding_train_step_is_used() -> None:
    calls: list[int] = []

    class CountingSteps(Client):
        def train_step(self, model, optimizer, x, y):  # type: ignore[no-untyped-def]
            calls.append(len(x))
            return super().train_step(model, optimizer, x, y)

    update = _fit(_client(CountingSteps, epochs=2, batch_size=7))
    assert calls == [7, 7, 7, 7, 2] * 2  # 30 rows in batches of 7, twice
    assert update.metrics["local_steps"] == 10


# --- per-round config from the strategy ------------------------------------------------------------


def test_config_overrides_epochs_and_batch_size_for_one_call_only() -> None:
    client = _client()
    config = {"epochs": 2, "batch_size": 30}
    update = _fit(client, config=config)
    assert len(update.epoch_losses) == 2
    assert update.metrics["local_steps"] == 2
    assert config == {"epochs": 2, "batch_size": 30}  # the strategy's dict is not modified
    assert (client.epochs, client.batch_size) == (3, 8)  # nor are the client's defaults
    assert len(_fit(client).epoch_losses) == 3


def test_config_lr_overrides_the_optimizer_factory() -> None:
    initial = flatten(_model())
    frozen = _fit(_client(), config={"lr": 0.0})
    assert torch.equal(frozen.params, initial)  # lr 0: SGD leaves every weight exactly where it was
    fast = _fit(_client(), config={"lr": 0.5})
    assert not torch.equal(fast.params, _fit(_client()).params)
    assert (fast.params - initial).norm() > (_fit(_client()).params - initial).norm()


def test_config_with_epochs_and_lr_together() -> None:
    explicit = _fit(_client(epochs=2, optimizer=_sgd(0.3)))
    via_config = _fit(_client(), config={"epochs": 2, "lr": 0.3})
    assert torch.equal(explicit.params, via_config.params)


@pytest.mark.parametrize(("field", "value"), [("epochs", 0), ("batch_size", 0)])
def test_constructor_rejects_bad_hyper_parameters(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=f"client.{field}"):
        Client(0, np.arange(3), **{field: value})


# --- evaluation ------------------------------------------------------------------------------------


def test_evaluate_on_the_local_test_split() -> None:
    client = _client()
    model = _model()
    _fit(client, model=model)
    result = client.evaluate(model, _data())
    assert result["num_examples"] == 15
    assert 0.0 <= result["accuracy"] <= 1.0
    assert math.isfinite(result["loss"]) and result["loss"] >= 0
    assert result["accuracy"] >= 0.8  # separable blobs after three epochs


def test_evaluate_known_answer_for_a_zero_model() -> None:
    data = _data()
    model = _model()
    load_flat(model, torch.zeros_like(flatten(model)))
    indices = torch.arange(30, 45)
    result = evaluate_indices(model, data, indices, batch_size=4)  # several batches
    # all logits equal: loss is ln(C) for every example and argmax picks class 0
    assert result["loss"] == pytest.approx(math.log(NUM_CLASSES), rel=1e-6)
    assert result["accuracy"] == pytest.approx(float((data.y[indices] == 0).float().mean()))
    assert result["num_examples"] == 15


def test_evaluate_with_no_local_test_data_reports_zero_examples() -> None:
    client = Client(0, np.arange(10))
    result = client.evaluate(_model(), _data())
    assert result["num_examples"] == 0 and math.isnan(result["accuracy"])


# --- the "seed-style user object": a Client subclass with its own hyper-parameters ------------------


class ProximalUser(Client):
    """A user's own client class with its own hyper-parameter ``mu`` (FedProx-style pull to the start)."""

    fitted: dict[int, int] = {}
    task_attributes = ("_anchor",)  # set at the start of every task, read by loss(): never carried over

    def __init__(self, client_id: int, train_indices: Any, test_indices: Any = (), *, mu: float, **kwargs: Any) -> None:
        super().__init__(client_id, train_indices, test_indices, **kwargs)
        self.mu = mu
        self._anchor: list[torch.Tensor] = []

    def fit(self, model: nn.Module, data: TensorData, **kwargs: Any) -> ClientUpdate:
        self._anchor = [p.detach().clone() for p in model.parameters()]
        ProximalUser.fitted[self.client_id] = ProximalUser.fitted.get(self.client_id, 0) + 1
        return super().fit(model, data, **kwargs)

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        prox = sum((p - a).pow(2).sum() for p, a in zip(model.parameters(), self._anchor, strict=True))
        return super().loss(model, x, y) + 0.5 * self.mu * prox


def _user_server(mu: float) -> Server:
    data = _data(n=90)
    factory = functools.partial(ProximalUser, mu=mu, epochs=2, batch_size=5, optimizer=_sgd())
    clients = [factory(client_id=i, train_indices=np.arange(i, 90, 3)) for i in range(3)]
    return Server(
        model_factory=functools.partial(LogisticRegression, (NUM_FEATURES,), NUM_CLASSES),
        federation=Federation(clients=clients, train_data=data, test_data=_data(n=30, seed=1)),
        strategy=FedAvg(),
        executor=SerialExecutor(),
        schedule=Schedule(num_rounds=2, clients_per_round=3),
        seed=0,
    )


def test_client_subclass_with_its_own_hyper_parameters_runs_in_a_server() -> None:
    ProximalUser.fitted.clear()
    free_server, pulled_server = _user_server(mu=0.0), _user_server(mu=8.0)
    initial = free_server.params.clone()
    assert torch.equal(initial, pulled_server.params)  # same seed, same initial model
    free, pulled = free_server.run(), pulled_server.run()
    assert ProximalUser.fitted == {0: 4, 1: 4, 2: 4}  # 3 clients × 2 rounds × 2 servers
    assert all(isinstance(c, ProximalUser) and c.mu == 8.0 for c in pulled_server.clients)
    assert (pulled.params - initial).norm() < 0.5 * (free.params - initial).norm()
    assert free.history[-1]["eval/accuracy"] > 0.8
