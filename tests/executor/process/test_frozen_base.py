"""The frozen base (weights that never travel) is built once by the process executor and shared read-only with its
workers: a worker compares its own with the shared one and, on the CPU, drops its own for it; a worker that builds
another base is refused in one line. (That LoRA runs stay bitwise serial's: tests/llm/test_lora_executors.py.)"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from fedsim.client.base import Client
from fedsim.core.errors import WorkerStartupError
from fedsim.core.params import flatten, frozen_entries
from fedsim.core.types import ClientUpdate, FitTask
from fedsim.data.tensor_data import TensorData
from fedsim.executor import ProcessExecutor, SerialExecutor
from fedsim.executor.base import Workload
from fedsim.executor.process.frozen import adopt_frozen_base, shared_frozen_base


def model_class(seed_from_pid: bool) -> type[nn.Module]:
    """A frozen layer (seeded from 0, or from the process id: every process builds another) under a trained one;
    defined here, inside a function, so that it reaches the workers by value."""

    class FrozenBase(nn.Module):
        federates_trainable_only = True

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(os.getpid() if seed_from_pid else 0)
            self.frozen = nn.Linear(4, 4).requires_grad_(False)
            self.head = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.relu(self.frozen(x)))

    return FrozenBase


def test_a_worker_adopts_the_shared_base_and_training_leaves_it_as_it_was() -> None:
    factory = model_class(seed_from_pid=False)
    shared = shared_frozen_base(factory())
    assert sorted(shared) == ["frozen.bias", "frozen.weight"] and all(t.is_shared() for t in shared.values())
    before = {name: t.clone() for name, t in shared.items()}
    model = factory()
    assert adopt_frozen_base(model, shared, torch.device("cpu")) is None
    assert all(value.data_ptr() == shared[name].data_ptr() for name, value in frozen_entries(model))
    nn.functional.cross_entropy(model(torch.ones(2, 4)), torch.tensor([0, 2])).backward()
    assert model.frozen.weight.grad is None and model.head.weight.grad is not None
    with torch.no_grad():  # a plain SGD step (torch.optim's first use costs seconds of lazy imports)
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.5 * p.grad
    assert all(torch.equal(shared[name], before[name]) for name in shared)


def test_another_base_is_named_and_not_adopted() -> None:
    shared = shared_frozen_base(model_class(seed_from_pid=False)())
    other = model_class(seed_from_pid=False)()
    with torch.no_grad():
        other.frozen.bias[1] += 1.0
    assert adopt_frozen_base(other, shared, torch.device("cpu")) == "frozen.bias: other values"
    assert other.frozen.weight.data_ptr() != shared["frozen.weight"].data_ptr()


def _workload(factory: type[nn.Module]) -> Workload:
    data = TensorData(torch.arange(48.0).reshape(12, 4) / 48, torch.tensor([0, 1, 2] * 4), 3)
    return Workload(factory, [Client(0, list(range(6)), batch_size=3), Client(1, list(range(6, 12)))], data)


@pytest.mark.slow
def test_process_workers_on_a_shared_base_give_serials_updates_bitwise() -> None:
    workload = _workload(model_class(seed_from_pid=False))
    init = flatten(workload.model_factory())
    tasks = [FitTask(client_id=c, round_num=1, seed=c) for c in (0, 1)]
    serial = SerialExecutor()
    serial.start(workload)
    expected = serial.fit(init, tasks)
    with ProcessExecutor(devices="cpu", workers=2) as executor:
        executor.start(workload)
        got = executor.fit(init, tasks)
    assert all(isinstance(r, ClientUpdate) for r in got)
    assert [torch.equal(a.params, b.params) for a, b in zip(got, expected, strict=True)] == [True, True]


@pytest.mark.slow
def test_a_worker_with_another_frozen_base_is_refused_in_one_line() -> None:
    with ProcessExecutor(devices="cpu", workers=1) as executor, pytest.raises(WorkerStartupError) as error:
        executor.start(_workload(model_class(seed_from_pid=True)))
    message = str(error.value)
    assert "\n" not in message and message.startswith("model: worker ")
    assert "built a frozen base different from the server's (frozen.weight: other values)" in message
