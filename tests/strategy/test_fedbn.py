"""FedBN: known answers of its rule, the client half's BatchNorm across tasks, which entries it finds, a run from
command-line overrides on model=cnn_bn, and worker processes equal to the serial executor bit for bit."""

from __future__ import annotations

import functools
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from builders import tiny_server
from torch import nn

sys.path.insert(0, str(Path(__file__).parent.parent))
import vision_files  # noqa: E402

from fedsim.cli.run import compose, run_config  # noqa: E402
from fedsim.client.base import Client  # noqa: E402
from fedsim.client.federation import federate  # noqa: E402
from fedsim.client.state import ClientStateStore  # noqa: E402
from fedsim.core.checkpoint import load_latest  # noqa: E402
from fedsim.core.params import ParamLayout, flatten  # noqa: E402
from fedsim.core.seeding import init_seed  # noqa: E402
from fedsim.core.types import ClientUpdate  # noqa: E402
from fedsim.data.partition import iid  # noqa: E402
from fedsim.data.tensor_data import DataSplit, TensorData  # noqa: E402
from fedsim.executor import ProcessExecutor, SerialExecutor  # noqa: E402
from fedsim.models import CNNBatchNorm  # noqa: E402
from fedsim.observe.run_logger import RunLogger  # noqa: E402
from fedsim.server.server import Server
from fedsim.strategy.context import RunContext  # noqa: E402
from fedsim.strategy.fedbn import STATE_KEY, FedBN, LocalNorms, norm_entries  # noqa: E402

BN_ENTRIES = ("1.weight", "1.bias", "1.running_mean", "1.running_var")


def _tiny() -> nn.Sequential:
    """Entries in flat order: 0.weight (2), 0.bias, 1.weight, 1.bias, 1.running_mean, 1.running_var, 2.weight,
    2.bias."""
    return nn.Sequential(nn.Linear(2, 1), nn.BatchNorm1d(1), nn.Linear(1, 1))


def _context(model: nn.Module) -> RunContext:
    return RunContext(
        layout=ParamLayout.of(model), num_clients=3, num_examples=(1, 3, 4), clients_per_round=2, num_rounds=1, seed=0
    )


def _setup(model: nn.Module, **kwargs: object) -> FedBN:
    strategy = FedBN(**kwargs)  # type: ignore[arg-type]
    strategy.setup(_context(model))
    return strategy


@pytest.fixture(autouse=True)
def _one_thread():  # type: ignore[no-untyped-def]
    """Tiny convolutions: a second intra-op thread on a shared 2-core machine makes them seconds slower."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_other_entries_are_averaged_and_batchnorm_keeps_the_global_values() -> None:
    strategy = _setup(_tiny())
    assert strategy.names == BN_ENTRIES
    global_params = torch.tensor([9.0, 9.0, 9.0, 1.0, 0.0, 0.0, 1.0, 9.0, 9.0])
    a = torch.arange(1.0, 10.0)  # client 0, 1 example
    updates = [ClientUpdate(0, 1, a, 1), ClientUpdate(2, 1, a + 4, 3)]  # client 2, 3 examples
    new = strategy.aggregate(1, global_params, updates)
    # (1·i + 3·(i + 4)) / 4 = i + 3 outside BatchNorm; BatchNorm's weight 1, bias 0, mean 0, variance 1 stay
    assert torch.equal(new, torch.tensor([4.0, 5.0, 6.0, 1.0, 0.0, 0.0, 1.0, 11.0, 12.0]))
    assert strategy.round_metrics(1) == {"local_fraction": 4 / 9}


def test_norm_layers_overrides_what_is_kept_local() -> None:
    strategy = _setup(_tiny(), norm_layers=r"^1\.(weight|bias)$")
    assert strategy.names == ("1.weight", "1.bias")
    updates = [ClientUpdate(0, 1, torch.arange(1.0, 10.0), 1)]
    new = strategy.aggregate(1, torch.zeros(9), updates)
    assert torch.equal(new, torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 6.0, 7.0, 8.0, 9.0]))  # running stats averaged
    grouped = _setup(nn.Sequential(nn.Conv2d(1, 2, 1), nn.GroupNorm(1, 2)), norm_layers=r"^1\.")
    assert grouped.names == ("1.weight", "1.bias")  # no running statistics: found by name only


@pytest.mark.parametrize(
    ("model", "kwargs", "message"),
    [
        (nn.Sequential(nn.Linear(2, 1), nn.Linear(1, 1)), {}, "FedBN needs a model with BatchNorm, e.g. model=cnn_bn"),
        (nn.Sequential(nn.Conv2d(1, 2, 1), nn.GroupNorm(1, 2)), {}, "FedBN needs a model with BatchNorm"),
        (_tiny(), {"norm_layers": "^head"}, "strategy.norm_layers='^head' matches no entry of the model"),
        (_tiny(), {"norm_layers": "."}, "strategy.norm_layers='.' selects every entry of the model"),
        (nn.BatchNorm1d(3), {}, "strategy.norm_layers=None selects every entry of the model"),
    ],
)
def test_a_model_with_nothing_to_keep_local_is_refused_in_one_line(
    model: nn.Module, kwargs: dict, message: str
) -> None:
    with pytest.raises(ValueError) as raised:
        _setup(model, **kwargs)
    assert str(raised.value).startswith(message) and "strategy.norm_layers" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_bad_pattern_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"^strategy\.norm_layers is not a regular expression"):
        FedBN(norm_layers="bn(")


def test_entries_found_on_the_cnn_with_batchnorm() -> None:
    def found(**kwargs: object) -> tuple[str, ...]:
        return norm_entries(ParamLayout.of(CNNBatchNorm((1, 8, 8), 10, fc_units=4, **kwargs)))  # type: ignore[arg-type]

    stats = ("weight", "bias", "running_mean", "running_var")
    assert found() == tuple(f"features.{i}.{s}" for i in (1, 5) for s in stats)
    assert found(fc_batch_norm=True) == found() + tuple(f"classifier.2.{s}" for s in stats)
    assert norm_entries(ParamLayout.of(nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2)))) == ()


def _fill(model: nn.Sequential, value: float) -> None:
    """Every BatchNorm entry of ``_tiny()`` set to ``value``; the first Linear's weight to ``-value``."""
    with torch.no_grad():
        for tensor in (model[1].weight, model[1].bias, model[1].running_mean, model[1].running_var):
            tensor.fill_(value)
        model[0].weight.fill_(-value)


def test_the_client_half_keeps_and_restores_its_own_batchnorm_across_tasks() -> None:
    model, half, state = _tiny(), LocalNorms(BN_ENTRIES), {}
    _fill(model, 2.0)  # the first task's global model
    half.begin_task(model, {}, state)  # a client's first task: the global BatchNorm stays
    assert float(model[1].running_mean) == 2.0
    _fill(model, 3.0)  # what training left
    half.end_task(model, {}, state)
    assert set(state[STATE_KEY]) == set(BN_ENTRIES) and all(float(v) == 3.0 for v in state[STATE_KEY].values())
    _fill(model, 5.0)  # the next task's global model
    half.begin_task(model, {}, state)
    assert [
        float(t.detach()) for t in (model[1].weight, model[1].bias, model[1].running_mean, model[1].running_var)
    ] == [3.0] * 4
    assert torch.all(model[0].weight == -5.0)  # the rest is the global model's
    assert state[STATE_KEY]["1.running_mean"] is not model[1].running_mean  # a copy, not the model's own tensor


def test_personalise_puts_the_clients_own_batchnorm_in() -> None:
    model, half = _tiny(), LocalNorms(BN_ENTRIES)
    _fill(model, 5.0)
    assert half.personalise(model, {}) is False and float(model[1].running_var) == 5.0  # never trained: unchanged
    own = {name: torch.full((1,), 7.0) for name in BN_ENTRIES}
    assert half.personalise(model, {STATE_KEY: own}) is True
    assert (
        float(model[1].running_var) == 7.0
        and float(model[1].weight.detach()) == 7.0
        and torch.all(model[0].weight == -5.0)
    )


def test_fedbn_runs_on_the_cnn_with_batchnorm_from_command_line_overrides(tmp_path: Path) -> None:
    root, run_dir = tmp_path / "mnist", tmp_path / "run"
    vision_files.write_mnist(root, n_train=40, n_test=10)
    overrides = [
        "model=cnn_bn",
        "model.fc_units=16",
        "strategy=fedbn",
        "data=mnist",
        f"data.root={root}",
        "partition.num_clients=2",
        "clients_per_round=2",
        "num_rounds=2",
        "logger.progress=false",
        "logger.tensorboard=false",
    ]
    result = run_config(
        compose(overrides), run_dir=run_dir
    )  # what `python -m fedsim <overrides>` runs, minus ~8 s of start-up
    final = load_latest(run_dir / "checkpoints")[1]["params"]
    assert torch.equal(final, result.params)
    torch.manual_seed(init_seed(0))  # the run's initial global model (seed=0)
    model = CNNBatchNorm(input_shape=(1, 28, 28), num_classes=10, fc_units=16)
    initial, layout = flatten(model), ParamLayout.of(model)
    local = layout.mask(norm_entries(layout))
    assert torch.equal(final[local], initial[local]), "the global BatchNorm never changes: clients keep theirs"
    assert not torch.equal(final[~local], initial[~local]), "the other layers are federated"
    store = ClientStateStore("disk", run_dir / "checkpoints" / "client_state")
    store.rewind(2)
    means = [store.get(cid)[STATE_KEY]["features.1.running_mean"] for cid in store.clients()]
    assert len(means) == 2 and not torch.equal(means[0], means[1]), "each client keeps statistics of its own"
    last = result.history[-1]
    assert (
        last["eval_personal/personalised"] == 2 and last["strategy/local_fraction"] == int(local.sum()) / local.numel()
    )


def _run(executor: object) -> Server:
    gen = torch.Generator().manual_seed(0)
    train = TensorData(torch.randn(48, 1, 8, 8, generator=gen), torch.arange(48) % 3, 3)
    test = TensorData(torch.randn(12, 1, 8, 8, generator=gen), torch.arange(12) % 3, 3)
    data = federate(DataSplit(train, test), functools.partial(iid, num_clients=4), client_test_fraction=0.25, seed=0)
    server = tiny_server(
        data,
        model=functools.partial(CNNBatchNorm, input_shape=(1, 8, 8), num_classes=3, fc_units=8),
        client=functools.partial(Client, epochs=1, batch_size=4),
        strategy=FedBN(),
        executor=executor,  # type: ignore[arg-type]
        clients_per_round=3,
        seed=7,
        logger=RunLogger(None, tensorboard=False, progress=False),
    )
    server.run()
    return server


def test_worker_processes_equal_the_serial_executor_bitwise() -> None:
    serial, process = _run(SerialExecutor()), _run(ProcessExecutor(devices="cpu", workers=2))
    assert torch.equal(serial.params, process.params)
    trained = Counter(c["client_id"] for record in serial.logger.history for c in record["clients"])
    assert max(trained.values()) >= 2, "some client must train again from its kept BatchNorm for this to mean anything"
    assert serial.parts.client_states.clients() == process.parts.client_states.clients() == sorted(trained)
    layout = ParamLayout.of(serial.model)
    for cid in serial.parts.client_states.clients():
        mine, theirs = serial.parts.client_states.get(cid)[STATE_KEY], process.parts.client_states.get(cid)[STATE_KEY]
        assert set(mine) == set(theirs) == set(norm_entries(layout))
        assert all(torch.equal(mine[name], theirs[name]) for name in mine), cid
        assert not torch.equal(mine["features.1.running_mean"], serial.params[layout.slice("features.1.running_mean")])
