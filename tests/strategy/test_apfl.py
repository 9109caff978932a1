"""APFL (Deng et al. 2020) and the per-batch hook it uses: known answers of two batches worked from the paper's
equations with plain float64 tensor arithmetic, the personalised model that evaluation scores, the hook's batches
and step numbers, and the one-line refusals (bad parameters, executor=vmap, a client with its own epoch loop)."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from fedsim.client.base import Client
from fedsim.client.local_training import Batch, LocalTraining
from fedsim.core.params import load_flat
from fedsim.core.types import ClientUpdate
from fedsim.data.tensor_data import TensorData
from fedsim.executor import VmapExecutor
from fedsim.executor.base import Workload
from fedsim.executor.vmap.optim import VmapUnsupportedError
from fedsim.privacy.local import DPSGDClient
from fedsim.strategy import APFL, Strategy
from fedsim.strategy.apfl import ALPHA_KEY, PERSONAL_KEY


class SquaredError(Client):
    """Loss ½ (x·w − label)², mean over the batch: its gradient is mean((x·w − y) x), written out below."""

    def per_example_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 0.5 * (logits[:, 0] - y.float()) ** 2


X = torch.tensor([[1.0, 2.0], [2.0, -1.0]])
Y = torch.tensor([3, 1])
TWO_EXAMPLES = TensorData(x=X, y=Y, num_classes=4)
ETA = 0.1
# float32 rounds each operation by at most 2⁻²⁴ relative; about 40 operations per batch on values below 10, over two
# batches: 2 · 40 · 10 · 6e-8 ≈ 5e-5
ATOL = 5e-5


def _grad(p: torch.Tensor) -> torch.Tensor:
    """∇ of mean ½ (x·p − y)² over the two examples, in float64."""
    x, y = X.double(), Y.double()
    return ((x @ p - y)[:, None] * x).mean(dim=0)


def _model(w: list[float]) -> nn.Module:
    model = nn.Linear(2, 1, bias=False)
    load_flat(model, torch.tensor(w))
    return model


def _fit(model: nn.Module, strategy: Strategy, state: dict, epochs: int = 2) -> ClientUpdate:
    """One batch of both examples per epoch: ``epochs`` steps."""
    client = SquaredError(0, [0, 1], epochs=epochs, batch_size=2, optimizer=functools.partial(torch.optim.SGD, lr=ETA))
    return client.fit(
        model, TWO_EXAMPLES, generator=torch.Generator().manual_seed(0), local=strategy.local_training(), state=state
    )


def _apfl_by_hand(w: torch.Tensor, v: torch.Tensor, alpha: float, steps: int, adapt: bool) -> tuple:
    """Algorithm 1 of the paper, each step from the values before it."""
    for _ in range(steps):
        g = _grad(alpha * v + (1 - alpha) * w)  # ∇f(v̄)
        new_alpha = min(max(alpha - ETA * float((v - w) @ g), 0.0), 1.0) if adapt else alpha
        w, v, alpha = w - ETA * _grad(w), v - ETA * alpha * g, new_alpha
    return w, v, alpha


@pytest.mark.parametrize("adapt", [False, True], ids=["fixed", "adaptive"])
def test_two_rounds_of_two_batches_follow_algorithm_1(adapt: bool) -> None:
    w0, state = torch.tensor([0.5, -0.5], dtype=torch.float64), {}
    strategy = APFL(alpha=0.25, adapt_alpha=adapt)
    first = _fit(_model(w0.tolist()), strategy, state)
    # round 1: v starts at w⁰, so ⟨v − w, ∇f⟩ = 0 on the first batch, not on the second
    w, v, alpha = _apfl_by_hand(w0, w0, 0.25, 2, adapt)
    assert torch.allclose(first.params.double(), w, atol=ATOL, rtol=0)
    assert torch.allclose(state[PERSONAL_KEY]["weight"].double().flatten(), v, atol=ATOL, rtol=0)
    assert state[ALPHA_KEY] == pytest.approx(alpha, abs=ATOL) and first.metrics["apfl_alpha"] == state[ALPHA_KEY]
    assert (state[ALPHA_KEY] != 0.25) is adapt
    # round 2 starts from a new global model and the kept v and α
    w1 = torch.tensor([1.0, 0.25], dtype=torch.float64)
    second = _fit(_model(w1.tolist()), strategy, state)
    w, v, alpha = _apfl_by_hand(w1, v, alpha, 2, adapt)
    assert torch.allclose(second.params.double(), w, atol=2 * ATOL, rtol=0)
    assert torch.allclose(state[PERSONAL_KEY]["weight"].double().flatten(), v, atol=2 * ATOL, rtol=0)
    assert state[ALPHA_KEY] == pytest.approx(alpha, abs=2 * ATOL)


def test_the_global_update_is_plain_sgd_and_evaluation_scores_the_mixture() -> None:
    state: dict = {}
    strategy = APFL(alpha=0.25)
    update = _fit(_model([0.5, -0.5]), strategy, state)
    plain = SquaredError(0, [0, 1], epochs=2, batch_size=2, optimizer=functools.partial(torch.optim.SGD, lr=ETA))
    alone = plain.fit(_model([0.5, -0.5]), TWO_EXAMPLES, generator=torch.Generator().manual_seed(0))
    assert torch.equal(update.params, alone.params)  # w's steps are the client's own, bit for bit
    evaluated = _model([2.0, 4.0])  # the global model at evaluation time
    assert not strategy.local_training().personalise(evaluated, {})  # a client that never trained
    assert strategy.local_training().personalise(evaluated, state)
    expected = 0.25 * state[PERSONAL_KEY]["weight"].flatten() + 0.75 * torch.tensor([2.0, 4.0])
    assert torch.allclose(evaluated.weight.detach().flatten(), expected, atol=1e-6, rtol=0)  # 3 float32 ops on < 10


class Recorder(LocalTraining):
    """A per-batch hook that records what it is given and leaves the step to the client."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, list[float], list[int]]] = []

    def on_batch(self, batch: Batch) -> None:
        self.seen.append((batch.step, batch.model.weight.detach().flatten().tolist(), batch.y.tolist()))
        batch.state["batches"] = batch.state.get("batches", 0) + 1


def test_the_hook_sees_every_batch_before_its_step_with_the_step_number() -> None:
    client = SquaredError(0, [0, 1], epochs=3, batch_size=1, optimizer=functools.partial(torch.optim.SGD, lr=ETA))
    recorder, state, model = Recorder(), {}, _model([0.5, -0.5])
    weights = [model.weight.detach().flatten().tolist()]
    client.fit(model, TWO_EXAMPLES, generator=torch.Generator().manual_seed(0), local=recorder, state=state)
    assert [step for step, _, _ in recorder.seen] == [0, 1, 2, 3, 4, 5] and state["batches"] == 6
    assert recorder.seen[0][1] == weights[0]  # before the first step: the global weights
    assert all(recorder.seen[i][1] != recorder.seen[i + 1][1] for i in range(5))  # a step between two calls
    assert sorted(y for _, _, ys in recorder.seen for y in ys) == [1, 1, 1, 3, 3, 3]  # each example once an epoch


@pytest.mark.parametrize("alpha", [1.5, -0.1])
def test_an_alpha_outside_0_1_is_refused_naming_the_field(alpha: float) -> None:
    with pytest.raises(ValueError, match=r"strategy\.alpha must be in \[0, 1\]") as error:
        APFL(alpha=alpha)
    assert "\n" not in str(error.value)


def test_vmap_refuses_a_per_batch_hook_in_one_line() -> None:
    with pytest.raises(VmapUnsupportedError, match=r"Mixture\.on_batch\).*use executor=process") as error:
        VmapExecutor().check(
            Workload(lambda: _model([0.0, 0.0]), [_client()], TWO_EXAMPLES, local=APFL().local_training())
        )
    assert "\n" not in str(error.value)


def _client() -> SquaredError:
    return SquaredError(0, [0, 1], epochs=1, batch_size=2)


def test_a_client_with_its_own_epoch_loop_is_refused() -> None:
    client = DPSGDClient(0, [0, 1], sampling_rate=0.5, noise_multiplier=1.0, clip_norm=1.0)
    with pytest.raises(TypeError, match="on_batch.*client=sgd"):
        client.fit(
            _model([0.0, 0.0]),
            TWO_EXAMPLES,
            generator=torch.Generator().manual_seed(0),
            local=APFL().local_training(),
            state={},
        )
