"""FedSA-LoRA's B never leaves its client: a round uploads the A matrices alone (``comm/bytes_up`` is A's float32 bytes
times the clients, exactly), the updates the strategy aggregates carry the global B, not the clients' trained ones,
and a value a client writes into its B (even a non-finite one) never reaches the server, through codecs and error
feedback too."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_lora_runs import args

from fedsim.cli.run import build_server, compose
from fedsim.comm import QSGD, Compression, TopK
from fedsim.core.params import ParamLayout
from fedsim.core.types import ClientUpdate
from fedsim.server.exchange import RESIDUAL, Exchange
from fedsim.strategy import FedAvg, FedSALoRA
from fedsim.strategy.context import RunContext
from fedsim.strategy.fedper import STATE_KEY


def fedsa_args(files: dict[str, Path], *extra: str) -> list[str]:
    """FedSA-LoRA (rank-4 adapters on c_attn) in test_lora_runs' 2-round run of 2 of the 4 users' clients."""
    return [
        *args(files, Path("unused")),
        "adapter=lora",
        "adapter.r=4",
        "adapter.target_modules=[c_attn]",
        "strategy=fedsa_lora",
        *extra,
    ]


def lora_layout() -> ParamLayout:
    """A LoRA-like layout: two A and two B entries of 8 values each, A and B interleaved as PEFT orders them."""
    names = ("h.0.lora_A.w", "h.0.lora_B.w", "h.1.lora_A.w", "h.1.lora_B.w")
    return ParamLayout(names, tuple(torch.Size([8]) for _ in names), tuple(torch.float32 for _ in names))


@pytest.mark.slow
def test_a_round_uploads_a_alone_and_the_server_never_sees_a_trained_b(llm_files: dict[str, Path]) -> None:
    server = build_server(compose(fedsa_args(llm_files, "num_rounds=1", "client.epochs=2")))
    seen: list[tuple[torch.Tensor, list[torch.Tensor]]] = []
    aggregate = server.strategy.aggregate

    def recording(round_num: int, global_params: torch.Tensor, updates: list[ClientUpdate]) -> torch.Tensor:
        seen.append((global_params.clone(), [u.params.clone() for u in updates]))
        return aggregate(round_num, global_params, updates)

    server.strategy.aggregate = recording  # type: ignore[method-assign]
    start = server.params.clone()
    result = server.run()
    layout = ParamLayout.of(server.model)
    b_rows = layout.mask(layout.matching(r"\.lora_B\."))
    shared = int((~b_rows).sum())
    assert 0 < shared < layout.numel
    assert result.history[0]["comm/bytes_up"] == 2 * 4 * shared  # two clients' float32 A matrices, no byte of B
    (global_params, updates) = seen[0]
    assert len(updates) == 2 and torch.equal(global_params, start)
    for update in updates:  # what reached the strategy: the trained A (B moved in epoch 1, A in 2), the global B
        assert torch.equal(update[b_rows], start[b_rows]) and not torch.equal(update[~b_rows], start[~b_rows])
    kept = [server.parts.client_states.get(cid)[STATE_KEY] for cid in server.parts.client_states.clients()]
    assert len(kept) == 2  # each client trained its B, which stayed in its state
    assert all(any(bool(b.abs().gt(0).any()) for b in own.values()) for own in kept)
    assert torch.equal(result.params[b_rows], start[b_rows])


def exchange_with_personal_b(compression: Compression) -> tuple[Exchange, torch.Tensor]:
    """An exchange told FedSA-LoRA's personal entries, and those entries' mask."""
    layout = lora_layout()
    strategy = FedSALoRA()
    strategy.setup(RunContext(layout, 2, (1, 1), 2, 1, seed=0))
    personal = strategy.personal_entries()
    assert personal is not None and int(personal.sum()) == 16
    exchange = Exchange(compression, layout.numel, seed=0)
    exchange.keep_on_clients(personal)
    return exchange, personal


def trained(personal: torch.Tensor, b_value: float) -> ClientUpdate:
    """A client's update: small A steps (0.01 · position) and ``b_value`` in every B entry."""
    params = torch.where(personal, torch.tensor(b_value), 0.01 * torch.arange(32, dtype=torch.float32))
    return ClientUpdate(0, 1, params, 1, state={"own": torch.ones(1)})


@pytest.mark.parametrize("b_value", [1e6, float("nan")])
def test_a_value_in_the_clients_b_never_reaches_the_server(b_value: float) -> None:
    exchange, personal = exchange_with_personal_b(Compression())
    global_params = torch.zeros(32)
    update = exchange.receive(trained(personal, b_value), global_params, global_params, {})
    assert isinstance(update, ClientUpdate)  # accepted: a non-finite B was never sent, so nothing to reject
    assert torch.equal(update.params[personal], global_params[personal])
    assert torch.equal(update.params[~personal], trained(personal, 0.0).params[~personal])
    assert exchange.up_bytes == 4 * 16  # the 16 A values as float32
    seen_by_an_attack = exchange.upload(trained(personal, b_value), global_params)  # before any attack replaces it
    assert isinstance(seen_by_an_attack, ClientUpdate)
    assert torch.equal(seen_by_an_attack.params - global_params, torch.where(personal, 0.0, update.params))


def test_codecs_and_error_feedback_see_the_shared_entries_only() -> None:
    """Top-2 of the 16 A values, then 8-bit QSGD: a top-k over the whole vector would pick two of B's 1e6 entries;
    this one picks A's two largest (0.01 x position: positions 22 and 23, the end of the second A), and the residual
    is 0 on every B entry."""
    compression = Compression(uplink=[TopK(fraction=2 / 16), QSGD(bits=8)], error_feedback=True)
    exchange, personal = exchange_with_personal_b(compression)
    assert exchange.up_bytes == compression.uplink.nbytes(16) < compression.uplink.nbytes(32)
    global_params = torch.zeros(32)
    update = exchange.receive(trained(personal, 1e6), global_params, global_params, {})
    assert isinstance(update, ClientUpdate) and update.state is not None
    assert (update.params != 0).nonzero().flatten().tolist() == [22, 23]
    assert torch.equal(update.params[personal], global_params[personal])
    residual = update.state[RESIDUAL]
    assert torch.equal(residual[personal], torch.zeros(16)) and update.state["own"].item() == 1.0


def test_a_strategy_without_personal_entries_uploads_everything() -> None:
    exchange = Exchange(Compression(), 32, seed=0)
    exchange.keep_on_clients(FedAvg().personal_entries())
    update = ClientUpdate(0, 1, torch.arange(32, dtype=torch.float32), 1)
    assert exchange.up_bytes == 4 * 32 and exchange.receive(update, torch.zeros(32), torch.zeros(32), {}) is update


def test_a_mask_of_another_length_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"^personal_entries\(\) must be a boolean mask of the 32 federated entries"):
        Exchange(Compression(), 32, seed=0).keep_on_clients(torch.zeros(31, dtype=torch.bool))
