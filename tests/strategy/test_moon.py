"""MOON (Li, He, Song, CVPR 2021): known answers of local steps with the model-contrastive term, worked from the paper's
Equations (3)-(4) written out in float64 (cosine similarities and the log-softmax share by hand, gradients by autograd
of that float64 expression), the first round without a negative pair (FedAvg's step bit for bit), the previous local
model kept in the client state, the representation (the input of the last Linear layer), and the one-line refusals."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch import nn

from fedsim.client.base import Client
from fedsim.core.params import flatten, load_flat
from fedsim.core.types import ClientUpdate
from fedsim.data.tensor_data import TensorData
from fedsim.models import MLP2NN, LogisticRegression, McMahanCNN
from fedsim.strategy import MOON
from fedsim.strategy.moon import PREVIOUS_KEY, captured, representation_layer

X = torch.tensor([[1.0, 2.0, -1.0], [2.0, -1.0, 0.5], [0.0, 1.0, 1.0], [-1.0, 0.5, 2.0]])
Y = torch.tensor([2, 0, 1, 2])
DATA = TensorData(x=X, y=Y, num_classes=3)
ETA, MU, TAU = 0.1, 2.0, 0.5
# float32 rounds each operation by at most 2⁻²⁴ ≈ 6e-8 relative. One step's loss and gradient take about 100
# operations on values below 10 (a 3→2→3 network, two more forwards, cosines, a softmax): 100 · 10 · 6e-8 = 6e-5 of
# gradient error, times η = 0.1, over the 4 steps of a task: 2.4e-5 on the weights. So 3e-5.
ATOL = 3e-5


def _model(seed: int) -> nn.Module:
    """z = tanh(W1 x + b1) (the representation, input of the last Linear), logits = W2 z + b2."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(3, 2), nn.Tanh(), nn.Linear(2, 3))


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().double().clone() for p in model.parameters()]


def _z(p: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ p[0].T + p[1])


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(1) / (a.pow(2).sum(1).sqrt() * b.pow(2).sum(1).sqrt())


def _moon_loss(p: list[torch.Tensor], glob: list[torch.Tensor], prev: list[torch.Tensor] | None, idx: list[int]):
    """ℓ_sup + μ ℓ_con of the batch ``idx`` (Equations (3)-(4)), in float64."""
    x, y = X[idx].double(), Y[idx]
    z = _z(p, x)
    logits = z @ p[2].T + p[3]
    supervised = -(logits.gather(1, y[:, None]).squeeze(1) - logits.exp().sum(1).log()).mean()
    if prev is None:
        return supervised
    positive, negative = (_cos(z, _z(glob, x)) / TAU).exp(), (_cos(z, _z(prev, x)) / TAU).exp()
    return supervised + MU * (-(positive / (positive + negative)).log()).mean()


def _by_hand(w: list[torch.Tensor], prev: list[torch.Tensor] | None, order: list[list[int]]) -> list[torch.Tensor]:
    glob = [t.clone() for t in w]
    for idx in order:
        leaves = [t.clone().requires_grad_() for t in w]
        grads = torch.autograd.grad(_moon_loss(leaves, glob, prev, idx), leaves)
        w = [t - ETA * g for t, g in zip(w, grads, strict=True)]
    return w


def _order(seed: int, epochs: int) -> list[list[int]]:
    """The batches of two examples over ``epochs`` passes, as the task's generator draws them."""
    generator, batches = torch.Generator().manual_seed(seed), []
    for _ in range(epochs):
        order = torch.randperm(4, generator=generator).tolist()
        batches += [order[0:2], order[2:4]]
    return batches


def _fit(model: nn.Module, strategy: MOON, state: dict[str, Any], seed: int = 3) -> ClientUpdate:
    client = Client(0, [0, 1, 2, 3], epochs=2, batch_size=2, optimizer=functools.partial(torch.optim.SGD, lr=ETA))
    local = strategy.local_training()
    return client.fit(model, DATA, generator=torch.Generator().manual_seed(seed), local=local, state=state)


def test_a_round_with_a_previous_model_follows_equations_3_and_4() -> None:
    model, previous = _model(0), _model(1)
    state: dict[str, Any] = {PREVIOUS_KEY: {n: p.detach().clone() for n, p in previous.named_parameters()}}
    expected = _by_hand(_params(model), _params(previous), _order(3, 2))
    update = _fit(model, MOON(mu=MU, temperature=TAU), state)
    assert torch.allclose(update.params.double(), torch.cat([t.flatten() for t in expected]), atol=ATOL, rtol=0)
    plain = _by_hand(_params(_model(0)), None, _order(3, 2))  # without the term: another answer
    assert not torch.allclose(update.params.double(), torch.cat([t.flatten() for t in plain]), atol=1e-3)
    assert update.metrics["moon_contrastive"] > 0
    trained = {n: p.detach() for n, p in model.named_parameters()}
    assert state[PREVIOUS_KEY].keys() == trained.keys()  # the new previous model: this task's trained one
    assert all(torch.equal(state[PREVIOUS_KEY][n], trained[n]) for n in trained)


def test_the_first_round_has_no_negative_pair_and_is_fedavgs_step() -> None:
    state: dict[str, Any] = {}
    update = _fit(_model(0), MOON(mu=MU, temperature=TAU), state)
    client = Client(0, [0, 1, 2, 3], epochs=2, batch_size=2, optimizer=functools.partial(torch.optim.SGD, lr=ETA))
    plain = client.fit(_model(0), DATA, generator=torch.Generator().manual_seed(3))
    assert torch.equal(update.params, plain.params) and update.metrics["moon_contrastive"] == 0.0
    assert PREVIOUS_KEY in state


def test_the_contrastive_term_of_one_batch_is_equation_3() -> None:
    """ℓ_con = −log(e^{s₊/τ} / (e^{s₊/τ} + e^{s₋/τ})) with s = cos(z, ·), here z = (1, 0), z_glob = (1, 1),
    z_prev = (0, 1): s₊ = 1/√2, s₋ = 0, so ℓ_con = log(1 + e^{−√2}) with τ = 0.5."""
    from fedsim.strategy.moon import contrastive_loss

    z, glob, prev = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 1.0]]), torch.tensor([[0.0, 1.0]])
    expected = torch.log1p(torch.exp(torch.tensor(-(2.0**0.5)))).item()
    assert contrastive_loss(z, glob, prev, 0.5).item() == pytest.approx(expected, rel=1e-6)
    assert contrastive_loss(z, glob, None, 0.5).item() == 0.0


@pytest.mark.parametrize(
    "model",
    [
        functools.partial(MLP2NN, (6,), 3, hidden=5),
        functools.partial(McMahanCNN, (1, 12, 12), 3, fc_units=7),
        lambda: _model(0),
    ],
    ids=["mlp", "cnn", "tanh"],
)
def test_the_representation_is_what_the_last_linear_layer_reads(model: Any) -> None:
    net = model()
    x = torch.randn(4, *((6,) if isinstance(net, MLP2NN) else (1, 12, 12) if isinstance(net, McMahanCNN) else (3,)))
    layer = representation_layer(net)
    with captured(layer) as seen:
        out = net(x)
    assert torch.equal(layer(seen[-1]), out)  # the output layer applied to the representation is the output
    assert seen[-1].shape[1] == layer.in_features


class NoLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x[:, None]).mean(-1)


@pytest.mark.parametrize(
    ("model", "says"),
    [
        (LogisticRegression((6,), 3), "LogisticRegression's reads the data itself"),
        (NoLinear(), "NoLinear has none"),
    ],
)
def test_a_model_without_a_representation_is_refused_in_one_line(model: nn.Module, says: str) -> None:
    with pytest.raises(ValueError, match="strategy=moon") as error:
        MOON().local_training().check(model)
    assert says in str(error.value) and "\n" not in str(error.value)
    MOON().local_training().check(MLP2NN((6,), 3))  # a hidden layer: accepted


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"mu": -1.0}, "strategy.mu"), ({"temperature": 0.0}, "strategy.temperature")],
)
def test_bad_parameters_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")) as error:
        MOON(**kwargs)
    assert "\n" not in str(error.value)


def test_the_global_model_is_the_tasks_start_and_is_not_trained() -> None:
    model = _model(0)
    start = flatten(model)
    local = MOON().local_training()
    local.begin_task(model, {}, {})
    load_flat(model, torch.zeros_like(start))
    assert torch.equal(torch.cat([t.flatten() for t in local.anchors[0].values()]), start)
