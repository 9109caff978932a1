"""LoRA runs on Ray actors: FedSA-LoRA with every-client evaluation gives serial's adapters, client states and
per-client perplexities bit for bit, and an actor that builds another frozen base is refused in one line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

ray = pytest.importorskip("ray")

from ray import cloudpickle  # noqa: E402

from fedsim.cli.run import build_server, compose  # noqa: E402
from fedsim.client.base import Client  # noqa: E402
from fedsim.core.errors import WorkerStartupError  # noqa: E402
from fedsim.data.tensor_data import TensorData  # noqa: E402
from fedsim.executor import RayExecutor  # noqa: E402
from fedsim.executor.base import Workload  # noqa: E402

ON_RAY = ["executor=ray", "executor.workers=2", "executor.reuse_actors=true"]


@pytest.fixture(autouse=True)
def _on_local_ray(local_ray) -> None:  # type: ignore[no-untyped-def]
    """Every test here joins the suite's one local Ray."""


def fedsa_run(files: dict[str, Path]) -> list[str]:
    """FedSA-LoRA on the tiny GPT-2, 2 rounds of 2 of the 4 users, every client scored after each round."""
    return [
        "model=hf_causal_lm",
        "model.hidden_size=32",
        "adapter=lora",
        "adapter.r=4",
        "adapter.target_modules=[c_attn]",
        "strategy=fedsa_lora",
        "data=jsonl_instructions",
        f"data.path={files['data']}",
        f"data.tokenizer={files['tokenizer']}",
        "data.seq_len=24",
        "data.user_column=user",
        "partition=natural",
        "client_test_fraction=0.25",
        "evaluate_clients=all",
        "num_rounds=2",
        "clients_per_round=2",
        "client.optimizer.lr=0.5",
    ]


def measured_free(history: list[dict]) -> list[dict]:
    """The rounds' metrics without the measured ones (wall times, memory), which differ from run to run."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "system/"))} for r in history]


@pytest.mark.slow
def test_fedsa_lora_on_ray_equals_serial_bitwise(llm_files: dict[str, Path]) -> None:
    reference = build_server(compose(fedsa_run(llm_files))).run()
    result = build_server(compose([*fedsa_run(llm_files), *ON_RAY])).run()
    assert torch.equal(result.params, reference.params)
    assert measured_free(result.history) == measured_free(reference.history)  # losses, perplexities, bytes
    last = reference.history[-1]
    assert last["eval_personal/perplexity"] > 0 and "eval_global/perplexity_p90" in last


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
