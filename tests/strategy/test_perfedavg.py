"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020): known answers of the first-order and Hessian-free steps worked
from the paper's update rules with plain float64 tensor arithmetic, on consecutive batches of one example each (the
batch order replayed from the task's generator), the step count, the personalised model of evaluation (one step α from
the global model), and the one-line refusals."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from fedsim.client.base import Client
from fedsim.core.params import load_flat
from fedsim.core.types import ClientUpdate
from fedsim.data.tensor_data import TensorData
from fedsim.strategy import PerFedAvg


class SquaredError(Client):
    """Loss ½ (x·w − label)², mean over the batch: one example's gradient is (x·w − y) x, its Hessian x xᵀ."""

    def per_example_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 0.5 * (logits[:, 0] - y.float()) ** 2


X = torch.tensor([[1.0, 2.0], [2.0, -1.0], [-1.0, 1.0]])
Y = torch.tensor([3, 1, 2])
DATA = TensorData(x=X, y=Y, num_classes=4)
ALPHA, BETA, DELTA, SEED = 0.1, 0.05, 0.01, 5
# float32 rounds each operation by at most 2⁻²⁴ ≈ 6e-8 relative. A gradient of values below 10 carries about 10 such
# roundings of quantities up to 10: 6e-6. FO: 2 steps of w with 2 gradients each, scaled by α and β below 1: 2 · 2 ·
# 6e-6 = 2.4e-5. HF: the finite difference divides two gradients' 6e-6 errors by 2δ = 0.02 (6e-4), times α and β
# (0.1 · 0.05): 3e-6 a step on top of FO's; 2 steps: 3e-5. So 5e-5 bounds both.
ATOL = 5e-5


def _grad(p: torch.Tensor, i: int) -> torch.Tensor:
    """∇ of ½ (x_i·p − y_i)² in float64."""
    x, y = X[i].double(), float(Y[i])
    return (x @ p - y) * x


def _loss(p: torch.Tensor, i: int) -> float:
    return float(0.5 * (X[i].double() @ p - float(Y[i])) ** 2)


def _order(epochs: int) -> list[int]:
    """The examples' order over ``epochs`` passes of batch size 1, as the task's generator draws it."""
    generator = torch.Generator().manual_seed(SEED)
    return [i for _ in range(epochs) for i in torch.randperm(3, generator=generator).tolist()]


def _model(w: torch.Tensor) -> nn.Module:
    model = nn.Linear(2, 1, bias=False)
    load_flat(model, w.float())
    return model


def _fit(strategy: PerFedAvg, w: torch.Tensor, epochs: int, optimizer: Any = None) -> ClientUpdate:
    client = SquaredError(0, [0, 1, 2], epochs=epochs, batch_size=1, optimizer=optimizer)
    return client.fit(
        _model(w),
        DATA,
        config=strategy.client_config(1, 0),
        generator=torch.Generator().manual_seed(SEED),
        local=strategy.local_training(),
        state={},
    )


W0 = torch.tensor([0.5, -0.5], dtype=torch.float64)


def test_first_order_steps_on_pairs_of_consecutive_batches() -> None:
    order = _order(2)  # 6 batches of one example: 3 steps of w
    w, losses = W0.clone(), []
    for d, d2 in zip(order[0::2], order[1::2], strict=True):
        adapted = w - ALPHA * _grad(w, d)  # w̃ = w − α ∇f(w; D)
        losses += [_loss(w, d), _loss(adapted, d2)]
        w = w - BETA * _grad(adapted, d2)  # w ← w − β ∇f(w̃; D')
    update = _fit(PerFedAvg(alpha=ALPHA, beta=BETA), W0, epochs=2)
    assert torch.allclose(update.params.double(), w, atol=ATOL, rtol=0)
    assert update.metrics["lr"] == BETA and update.metrics["local_steps"] == 6
    assert update.metrics["train_loss"] == pytest.approx(np.mean([np.mean(losses[:3]), np.mean(losses[3:])]), abs=ATOL)


def test_hessian_free_steps_on_triples_of_consecutive_batches() -> None:
    order = _order(2)  # 6 batches: 2 steps of w
    w = W0.clone()
    for d, d2, d3 in zip(order[0::3], order[1::3], order[2::3], strict=True):
        g = _grad(w - ALPHA * _grad(w, d), d2)  # ∇f(w̃; D')
        hvp = (_grad(w + DELTA * g, d3) - _grad(w - DELTA * g, d3)) / (2 * DELTA)  # d̃ on D''
        assert torch.allclose(hvp, X[d3].double() * (X[d3].double() @ g), rtol=1e-9)  # = x xᵀ g: f is quadratic
        w = w - BETA * (g - ALPHA * hvp)  # w ← w − β [∇f(w̃; D') − α d̃]
    update = _fit(PerFedAvg(alpha=ALPHA, beta=BETA, variant="hf", delta=DELTA), W0, epochs=2)
    assert torch.allclose(update.params.double(), w, atol=ATOL, rtol=0)
    first_order = _fit(PerFedAvg(alpha=ALPHA, beta=BETA), W0, epochs=2)
    assert not torch.allclose(update.params, first_order.params, atol=1e-3)  # the Hessian term matters


@pytest.mark.parametrize(("variant", "per_step"), [("fo", 2), ("hf", 3)])
@pytest.mark.parametrize("batches", [1, 5, 6, 7])
def test_k_batches_make_floor_k_over_2_or_3_steps_of_w(variant: str, per_step: int, batches: int) -> None:
    steps: list[int] = []

    def counting(params: Any) -> torch.optim.Optimizer:
        optimizer = torch.optim.SGD(params, lr=0.1)
        optimizer.register_step_post_hook(lambda *_: steps.append(1))
        return optimizer

    client = SquaredError(0, [0, 1, 2], batch_size=1, optimizer=counting, local_steps=batches)
    strategy = PerFedAvg(variant=variant)
    client.fit(_model(W0), DATA, generator=torch.Generator().manual_seed(0), local=strategy.local_training())
    assert len(steps) == batches // per_step


def test_beta_null_steps_with_the_clients_own_rate() -> None:
    sgd = functools.partial(torch.optim.SGD, lr=BETA)
    assert PerFedAvg().client_config(1, 0) == {}
    update = _fit(PerFedAvg(alpha=ALPHA), W0, epochs=2, optimizer=sgd)
    assert torch.equal(update.params, _fit(PerFedAvg(alpha=ALPHA, beta=BETA), W0, epochs=2).params)


def test_evaluation_personalises_by_one_full_batch_step_alpha_from_the_global_model() -> None:
    client = SquaredError(0, [0, 2], [1])
    local = PerFedAvg(alpha=ALPHA).local_training()
    model = _model(W0)
    model.train()
    assert local.adapt(model, {}, client, DATA)
    expected = W0 - ALPHA * (_grad(W0, 0) + _grad(W0, 2)) / 2  # θ = w − α ∇f_i(w; D_i), D_i its training examples
    assert torch.allclose(model.weight.detach().double().flatten(), expected, atol=1e-6, rtol=0)
    assert model.training  # its mode is put back
    assert not local.adapt(_model(W0), {}, SquaredError(1, [], [1]), DATA)  # nothing to adapt on: the global model


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"alpha": 0.0}, "strategy.alpha"),
        ({"beta": -0.1}, "strategy.beta"),
        ({"variant": "maml"}, "strategy.variant must be fo or hf"),
        ({"delta": 0.0}, "strategy.delta"),
    ],
)
def test_bad_parameters_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")) as error:
        PerFedAvg(**kwargs)
    assert "\n" not in str(error.value)
