"""pFedMe (T Dinh et al., NeurIPS 2020): known answers of two batches with K inner steps worked from Algorithm 1 with
plain float64 tensor arithmetic, the server's β-step, the personal model that evaluation scores, and the one-line
refusal of bad parameters."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from fedsim.client.base import Client
from fedsim.core.params import load_flat
from fedsim.core.types import ClientUpdate
from fedsim.data.tensor_data import TensorData
from fedsim.strategy import PFedMe
from fedsim.strategy.pfedme import PERSONAL_KEY


class SquaredError(Client):
    """Loss ½ (x·w − label)², mean over the batch: its gradient is mean((x·w − y) x), written out below."""

    def per_example_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 0.5 * (logits[:, 0] - y.float()) ** 2


X = torch.tensor([[1.0, 2.0], [2.0, -1.0]])
Y = torch.tensor([3, 1])
TWO_EXAMPLES = TensorData(x=X, y=Y, num_classes=4)
ETA, LAM, PERSONAL_LR = 0.1, 0.5, 0.2
# float32 rounds each operation by at most 2⁻²⁴ relative; about 25 operations per inner step on values below 10, three
# inner steps and w's step per batch, two batches: 2 · 4 · 25 · 10 · 6e-8 ≈ 1.2e-4
ATOL = 1.2e-4


def _loss_and_grad(p: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Mean ½ (x·p − y)² over the two examples and its gradient, in float64."""
    x, y = X.double(), Y.double()
    r = x @ p - y
    return float((0.5 * r**2).mean()), (r[:, None] * x).mean(dim=0)


def _model(w: list[float]) -> nn.Module:
    model = nn.Linear(2, 1, bias=False)
    load_flat(model, torch.tensor(w))
    return model


def _fit(model: nn.Module, strategy: PFedMe, state: dict) -> ClientUpdate:
    """One batch of both examples per epoch, two epochs: two steps."""
    client = SquaredError(0, [0, 1], epochs=2, batch_size=2, optimizer=functools.partial(torch.optim.SGD, lr=ETA))
    return client.fit(
        model, TWO_EXAMPLES, generator=torch.Generator().manual_seed(0), local=strategy.local_training(), state=state
    )


def test_two_batches_of_three_inner_steps_follow_algorithm_1() -> None:
    w = torch.tensor([0.5, -0.5], dtype=torch.float64)
    state: dict = {"pfedme_personal": {"weight": torch.full((1, 2), 9.0)}}  # a last round's θ: not the start
    update = _fit(_model(w.tolist()), PFedMe(lam=LAM, personal_lr=PERSONAL_LR, inner_steps=3), state)
    theta, losses = w.clone(), []  # θ starts at the round's global weights
    for _ in range(2):  # batches
        for _ in range(3):  # θ ← θ − p (∇f(θ) + λ (θ − w))
            loss, g = _loss_and_grad(theta)
            theta = theta - PERSONAL_LR * (g + LAM * (theta - w))
        losses.append(loss)  # f(θ) at the last inner step
        w = w - ETA * LAM * (w - theta)  # w ← w − η λ (w − θ̃)
    assert torch.allclose(update.params.double(), w, atol=ATOL, rtol=0)
    assert torch.allclose(state[PERSONAL_KEY]["weight"].double().flatten(), theta, atol=ATOL, rtol=0)
    assert update.metrics["train_loss"] == pytest.approx(sum(losses) / 2, abs=ATOL)
    assert not torch.allclose(update.params.double(), theta, atol=1e-2)  # w and θ differ: λ pulls, does not tie


def test_the_server_takes_a_beta_step_towards_the_weighted_average() -> None:
    updates = [
        ClientUpdate(client_id=0, round_num=1, params=torch.tensor([1.0, 3.0]), num_examples=1),
        ClientUpdate(client_id=1, round_num=1, params=torch.tensor([4.0, 0.0]), num_examples=2),
    ]
    start = torch.tensor([0.0, 1.0])
    # average (1·(1, 3) + 2·(4, 0)) / 3 = (3, 1); β = 2: (1 − 2)·(0, 1) + 2·(3, 1) = (6, 1); β = 1: the average
    assert torch.allclose(PFedMe(beta=2.0).aggregate(1, start, updates), torch.tensor([6.0, 1.0]), atol=1e-6, rtol=0)
    assert torch.allclose(PFedMe().aggregate(1, start, updates), torch.tensor([3.0, 1.0]), atol=1e-6, rtol=0)


def test_evaluation_scores_the_personal_model() -> None:
    state: dict = {}
    strategy = PFedMe(lam=LAM, personal_lr=PERSONAL_LR)
    _fit(_model([0.5, -0.5]), strategy, state)
    evaluated = _model([7.0, 7.0])
    assert not strategy.local_training().personalise(evaluated, {})
    assert strategy.local_training().personalise(evaluated, state)
    assert torch.equal(evaluated.weight.detach(), state[PERSONAL_KEY]["weight"])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"lam": -1.0}, "strategy.lam"),
        ({"lam": 0.0}, "strategy.lam"),
        ({"personal_lr": 0.0}, "strategy.personal_lr"),
        ({"inner_steps": 0}, "strategy.inner_steps"),
        ({"beta": 0.0}, "strategy.beta"),
    ],
)
def test_bad_parameters_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")) as error:
        PFedMe(**kwargs)
    assert "\n" not in str(error.value)
