"""FFA-LoRA and FedSA-LoRA on a tiny GPT-2 trained by real clients: FFA-LoRA's average of B is exactly the average of
the clients' ΔW = s·B·A (and plain LoRA's is not), FedSA-LoRA's B stays on its client while A is averaged."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli

from fedsim.client.base import Client
from fedsim.core.params import ParamLayout, flatten, frozen_hash, load_flat
from fedsim.core.types import ClientUpdate
from fedsim.data.instructions import jsonl_instructions
from fedsim.data.tensor_data import TensorData
from fedsim.models.hf_lm import LoRA, hf_causal_lm
from fedsim.strategy import FedAvg, FedSALoRA, Strategy
from fedsim.strategy.context import RunContext
from fedsim.strategy.fedper import STATE_KEY
from fedsim.strategy.functional import weighted_average

SEQ_LEN, HIDDEN, RANK = 24, 32, 4
SCALE = 8 / RANK  # alpha / r: an exact power of two
U32 = 2.0**-24  # unit roundoff of float32
CLIENT_ROWS = (range(0, 8), range(8, 28))  # two clients of 8 and 20 examples: FedAvg weights 2/7 and 5/7


@pytest.fixture(scope="module")
def data(llm_files: dict[str, Path]) -> TensorData:
    """The instruction rows, tokenised; a first model is built and trained here so that the tests' own times do not
    carry the imports of transformers and peft."""
    train = jsonl_instructions(path=str(llm_files["data"]), tokenizer=str(llm_files["tokenizer"]), seq_len=SEQ_LEN)
    model = tiny(train.train.num_classes, train_a=True)
    client_updates(model, train.train, flatten(model))
    return train.train


def tiny(vocab: int, train_a: bool) -> torch.nn.Module:
    """GPT-2 of 2 layers with rank-4 adapters on c_attn; ``train_a=False`` is FFA-LoRA."""
    model = hf_causal_lm(input_shape=(SEQ_LEN,), num_classes=vocab, hidden_size=HIDDEN, seed=0)
    return LoRA(r=RANK, alpha=8, target_modules=["c_attn"], train_a=train_a, seed=0).apply(model)


def client_updates(
    model: torch.nn.Module,
    data: TensorData,
    start: torch.Tensor,
    strategy: Strategy | None = None,
    states: list[dict] | None = None,
) -> list[ClientUpdate]:
    """Each client's update after one local epoch (SGD, lr 0.5, batches of 4) from the global vector ``start``, with
    the strategy's client half and the clients' ``states`` (changed in place) when given."""
    updates = []
    for cid, rows in enumerate(CLIENT_ROWS):
        client = Client(cid, list(rows), batch_size=4, optimizer=functools.partial(torch.optim.SGD, lr=0.5))
        load_flat(model, start)
        local = strategy.local_training() if strategy is not None else None
        state = states[cid] if states is not None else {}
        updates.append(client.fit(model, data, generator=torch.Generator().manual_seed(cid), local=local, state=state))
    return updates


def lora_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """PEFT's LoRA layers of ``model`` (one per wrapped c_attn)."""
    return [m for m in model.modules() if hasattr(m, "lora_A") and "default" in getattr(m, "lora_A", {})]


def delta_w(model: torch.nn.Module, vector: torch.Tensor) -> list[torch.Tensor]:
    """The real model's ΔW (PEFT's ``get_delta_weight``, float32) of every LoRA layer with ``vector`` loaded."""
    load_flat(model, vector)
    with torch.no_grad():
        return [layer.get_delta_weight("default").clone() for layer in lora_layers(model)]


def test_ffa_lora_federates_b_only_and_a_is_seeded(data: TensorData) -> None:
    model = tiny(data.num_classes, train_a=False)
    layout = ParamLayout.of(model)
    assert layout.names and all(".lora_B." in name for name in layout.names)
    assert layout.numel == 2 * (3 * HIDDEN) * RANK  # B of c_attn: out = 3 hidden, in = r; A travels not
    a = [layer.lora_A["default"].weight for layer in lora_layers(model)]
    assert all(not w.requires_grad and bool(w.abs().gt(0).all()) for w in a)  # frozen, at its kaiming init
    # the frozen-base hash covers A: the same seed builds the same A, another seed an A that workers would refuse
    assert frozen_hash(model) == frozen_hash(tiny(data.num_classes, train_a=False))
    other = LoRA(r=RANK, alpha=8, target_modules=["c_attn"], train_a=False, seed=1)
    base = hf_causal_lm(input_shape=(SEQ_LEN,), num_classes=data.num_classes, hidden_size=HIDDEN, seed=0)
    assert frozen_hash(model) != frozen_hash(other.apply(base))
    before = frozen_hash(model)
    client_updates(model, data, flatten(model))
    assert frozen_hash(model) == before  # training changed no A


def mean_and_bound(model: torch.nn.Module, updates: list[ClientUpdate], averaged: torch.Tensor) -> list[tuple]:
    """Per LoRA layer: Σ_k w_k ΔW_k (float64 sum of the clients' float32 ΔWs), the ΔW of the averaged vector, and
    the rounding bound between the two when A is shared.

    Each float32 ΔW entry Σ_l B_il·A_lj (r products) is within γ_r = r·u / (1 − r·u) of the exact value, relative to
    Σ_l |B_il|·|A_lj|, whatever the summation order (FMA or not); the scale s = alpha / r = 2 is exact; the averaged
    B is the float64 average rounded to float32 once (u), and the float64 sums add < u. With the same A on both
    sides: |Σ_k w_k ΔW_k − ΔW(Σ_k w_k B_k)| ≤ s·(Σ_k w_k |B_k|)·|A|·(2γ_r + 2u)."""
    weights = [u.num_examples / sum(v.num_examples for v in updates) for u in updates]
    clients = [delta_w(model, u.params) for u in updates]
    b_abs = [torch.zeros(1, dtype=torch.float64) for _ in lora_layers(model)]
    for w, update in zip(weights, updates, strict=True):
        load_flat(model, update.params)
        for i, layer in enumerate(lora_layers(model)):
            b_abs[i] = b_abs[i] + w * layer.lora_B["default"].weight.detach().abs().double()
    after = delta_w(model, averaged)
    gamma = RANK * U32 / (1 - RANK * U32)
    result = []
    for i, layer in enumerate(lora_layers(model)):
        mean = sum(w * c[i].double() for w, c in zip(weights, clients, strict=True))
        a_abs = layer.lora_A["default"].weight.detach().abs().double()
        bound = (SCALE * (b_abs[i] @ a_abs) * (2 * gamma + 2 * U32)).T  # ΔW of GPT-2's Conv1D is (B·A)ᵀ
        result.append((mean, after[i].double(), bound))
    return result


def test_ffa_lora_average_of_b_is_exactly_the_average_of_delta_w(data: TensorData) -> None:
    model = tiny(data.num_classes, train_a=False)
    start = flatten(model)
    assert not bool(start.any())  # B starts at zero (LoRA's init): every ΔW starts at exactly 0
    updates = client_updates(model, data, start)
    assert all(not torch.equal(u.params, start) for u in updates)  # both clients trained their B
    for mean, of_mean, bound in mean_and_bound(model, updates, FedAvg().aggregate(1, start, updates)):
        assert bool(((mean - of_mean).abs() <= bound).all())
        assert float(of_mean.abs().max()) > 1e3 * float(bound.max())  # the update is far above the rounding


def test_plain_lora_average_is_not_the_average_of_delta_w(data: TensorData) -> None:
    """The same check fails for LoRA with A trained (FedIT): the mean of products is not the product of means."""
    model = tiny(data.num_classes, train_a=True)
    start = flatten(model)
    updates = client_updates(model, data, start)
    worst = max(
        float(((mean - of_mean).abs() - 1e3 * bound).max())
        for mean, of_mean, bound in mean_and_bound(model, updates, FedAvg().aggregate(1, start, updates))
    )
    assert worst > 0  # some entry differs by more than a thousand times the rounding bound


def test_fedsa_lora_averages_a_and_keeps_every_clients_b(data: TensorData) -> None:
    model = tiny(data.num_classes, train_a=True)
    layout, start = ParamLayout.of(model), flatten(model)
    b_rows, a_rows = layout.mask(layout.matching(r"\.lora_B\.")), layout.mask(layout.matching(r"\.lora_A\."))
    assert bool((a_rows ^ b_rows).all())  # every federated entry is an A or a B
    strategy = FedSALoRA()
    strategy.setup(RunContext(layout, 2, (8, 20), 2, 2, seed=0))
    states: list[dict] = [{}, {}]
    updates = client_updates(model, data, start, strategy, states)
    new = strategy.aggregate(1, start, updates)
    assert torch.equal(new[b_rows], start[b_rows])  # no client's B reaches the global model (it stays at zero)
    expected_a = weighted_average([u.params for u in updates], [8, 20])[a_rows]  # FedAvg's weights 8 : 20
    assert torch.equal(new[a_rows], expected_a) and not torch.equal(new[a_rows], start[a_rows])
    for update, state in zip(updates, states, strict=True):  # each client keeps the B it trained
        kept = torch.cat([state[STATE_KEY][name].reshape(-1) for name in layout.matching("lora_B")])
        assert torch.equal(kept, update.params[b_rows])
    assert not torch.equal(updates[0].params[b_rows], updates[1].params[b_rows])
    # round 2: each client trains from the new global A with its own B, not the global (zero) one
    load_flat(model, new)
    assert strategy.local_training().personalise(model, states[1])
    assert torch.equal(flatten(model)[b_rows], updates[1].params[b_rows])
    assert torch.equal(flatten(model)[a_rows], new[a_rows])


def test_fedsa_lora_refuses_a_model_without_adapters_in_one_line() -> None:
    layout = ParamLayout.of(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"^strategy=fedsa_lora needs a model with LoRA adapters .*adapter=lora"):
        FedSALoRA().setup(RunContext(layout, 2, (1, 1), 2, 2, seed=0))


@pytest.mark.slow
def test_ffa_lora_run_serial_equals_process_and_sends_b_only(llm_files: dict[str, Path], tmp_path: Path) -> None:
    """The process workers build the same frozen A as the server (their frozen-base hash is checked at start-up)."""
    from test_lora_runs import args, final_params

    results = {}
    for executor in ("serial", "process"):
        extra = ("adapter=ffa_lora", "adapter.r=4", "adapter.target_modules=[c_attn]", f"executor={executor}")
        run = run_cli(args(llm_files, tmp_path / executor, *extra))
        assert run.returncode == 0, run.stderr
        results[executor] = final_params(tmp_path / executor)
    assert torch.equal(results["serial"], results["process"])
    b_only = 2 * (3 * HIDDEN) * RANK
    assert results["serial"].numel() == b_only
    first = json.loads((tmp_path / "serial" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["comm/bytes_up"] == 2 * 4 * b_only  # two clients' float32 B matrices, no A
