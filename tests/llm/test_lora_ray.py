"""LoRA on Ray actors: an actor that builds another frozen base is refused in one line. (That Ray gives serial's
adapters, client states and per-client perplexities bit for bit: tests/llm/test_lora_executors.py.)"""

from __future__ import annotations

import os
import sys

import pytest
import torch
from torch import nn

ray = pytest.importorskip("ray")

from ray import cloudpickle  # noqa: E402

from fedsim.client.base import Client  # noqa: E402
from fedsim.core.errors import WorkerStartupError  # noqa: E402
from fedsim.data.tensor_data import TensorData  # noqa: E402
from fedsim.executor import RayExecutor  # noqa: E402
from fedsim.executor.base import Workload  # noqa: E402


@pytest.fixture(autouse=True)
def _on_local_ray(local_ray) -> None:  # type: ignore[no-untyped-def]
    """Every test here joins the suite's one local Ray."""


class FrozenByProcess(nn.Module):
    """A frozen layer seeded from the process id (so every process builds another one) under a trained one."""

    federates_trainable_only = True

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(os.getpid())
        self.frozen = nn.Linear(2, 2).requires_grad_(False)
        self.head = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.frozen(x))


cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the model class above reaches the actors by value


def test_actor_with_another_frozen_base_is_refused_in_one_line() -> None:
    data = TensorData(torch.ones(4, 2), torch.tensor([0, 1, 2, 0]), 3)
    with RayExecutor(workers=1, reuse_actors=True) as executor, pytest.raises(WorkerStartupError) as error:
        executor.start(Workload(FrozenByProcess, [Client(0, [0, 1, 2, 3])], data))
    message = str(error.value)
    assert "\n" not in message and message.startswith("model: Ray worker r0 (pid ")
    assert "built a frozen base (hash" in message and "different from the driver's" in message
