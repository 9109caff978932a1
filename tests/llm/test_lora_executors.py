"""FedIT (FedAvg on the LoRA adapters) and FedSA-LoRA (each client's B in its client state) give bitwise the same
adapters, client states and metrics under the serial, process and Ray executors; so does FedIT on a bfloat16 base
with gradient checkpointing and autocast (serial and Ray)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from test_fedsa_upload import fedsa_args

from fedsim.cli.run import build_server, compose
from fedsim.server import Server
from fedsim.strategy.fedper import STATE_KEY

pytest.importorskip("ray")

EXECUTORS = {
    "serial": ["executor=serial"],
    "process": ["executor=process", "executor.workers=2"],
    "ray": ["executor=ray", "executor.workers=2", "executor.reuse_actors=true"],
}


def run(files: dict[str, Path], strategy: str, executor: str, *extra: str) -> tuple[Server, list[dict[str, Any]]]:
    """2 rounds of 2 of the 4 users, 2 local epochs (so that A moves as well as B), every client evaluated."""
    overrides = fedsa_args(files, f"strategy={strategy}", "client.epochs=2", "evaluate_clients=all", *extra)
    server = build_server(compose([*overrides, "client_test_fraction=0.25", *EXECUTORS[executor]]))
    history = server.run().history
    return server, [{k: v for k, v in r.items() if not k.startswith(("time/", "system/"))} for r in history]


@pytest.fixture(scope="module")
def serial_run(llm_files: dict[str, Path]) -> Callable[[str], tuple[Server, list[dict[str, Any]]]]:
    """The serial run of a strategy (without extra settings), run once per module: the reference of the executors'
    test and the plain run the bfloat16 test differs from."""
    runs: dict[str, tuple[Server, list[dict[str, Any]]]] = {}

    def get(strategy: str) -> tuple[Server, list[dict[str, Any]]]:
        if strategy not in runs:
            runs[strategy] = run(llm_files, strategy, "serial")
        return runs[strategy]

    return get


def states(server: Server) -> dict[int, dict[str, torch.Tensor]]:
    """Every client's kept entries (FedSA-LoRA's B), by client id."""
    return {cid: server.parts.client_states.get(cid).get(STATE_KEY, {}) for cid in server.parts.client_states.clients()}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fedavg", "fedsa_lora"])
def test_serial_process_and_ray_are_bitwise_equal(
    strategy: str, llm_files: dict[str, Path], serial_run: Callable, local_ray: Any
) -> None:
    reference, reference_history = serial_run(strategy)
    kept = states(reference)
    assert bool(kept) == (strategy == "fedsa_lora")  # FedIT keeps nothing on its clients
    for executor in ("process", "ray"):
        server, history = run(llm_files, strategy, executor)
        assert torch.equal(server.params, reference.params), executor
        assert history == reference_history, executor  # losses, perplexities, bytes
        theirs = states(server)
        assert theirs.keys() == kept.keys(), executor
        for cid, entries in kept.items():
            assert entries.keys() == theirs[cid].keys()
            assert all(torch.equal(value, theirs[cid][name]) for name, value in entries.items()), (executor, cid)


@pytest.mark.slow
def test_a_bfloat16_base_with_checkpointing_and_autocast_is_bitwise_equal_on_ray(
    llm_files: dict[str, Path], serial_run: Callable, local_ray: Any
) -> None:
    """model.dtype, model.gradient_checkpointing and client.autocast (tests/llm/test_precision.py: serial =
    process) on Ray actors too."""
    knobs = ("model.dtype=bfloat16", "model.gradient_checkpointing=true", "client.autocast=bfloat16")
    reference, reference_history = run(llm_files, "fedavg", "serial", *knobs)
    server, history = run(llm_files, "fedavg", "ray", *knobs)
    assert torch.equal(server.params, reference.params) and history == reference_history
    plain, _ = serial_run("fedavg")
    assert not torch.equal(plain.params, reference.params)  # the knobs were in force
