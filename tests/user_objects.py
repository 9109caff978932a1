"""User objects as hand-written simulations have them (own data, own model, ``train(state_dict)``), for
tests/client/test_adapters.py; a module of its own so that spawned process workers can import them by name."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES, CLASSES = 6, 3


def make_model() -> nn.Module:
    """The architecture every user trains, and the server's ``model_factory``; dropout uses torch's global RNG."""
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, CLASSES))


def make_data(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` examples of a fixed linear 3-class problem, drawn with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    w = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(1234))
    return x, (x @ w).argmax(dim=1)


class User:
    """One simulated user: its own examples, a DataLoader that shuffles them, its own model and SGD settings."""

    def __init__(
        self, x: torch.Tensor, y: torch.Tensor, *, lr: float = 0.1, epochs: int = 2, batch_size: int = 8
    ) -> None:
        # shuffle=True draws from torch's global RNG, which fedsim seeds for every task
        self.loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True)
        self.model = make_model()
        self.lr, self.epochs = lr, epochs
        self.calls = 0  # bookkeeping on self: fedsim puts the object back after every task, so this stays 0

    def train(self, state_dict: dict[str, torch.Tensor]) -> Any:
        self.calls += 1
        self.model.load_state_dict(state_dict)
        self.model.train()
        optimizer = torch.optim.SGD(self.model.parameters(), lr=self.lr)
        for _ in range(self.epochs):
            for x, y in self.loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(self.model(x), y).backward()
                optimizer.step()
        return self.model.state_dict(), len(self.loader.dataset)


class NoisyUser(User):
    """Adds noise drawn from the task's ``generator`` (the keyword form), and keeps a round counter in client state."""

    def train(self, state_dict: dict[str, torch.Tensor], *, generator: torch.Generator, state: dict[str, Any]) -> Any:
        trained, n = super().train(state_dict)
        state["rounds"] = state.get("rounds", 0) + 1
        noisy = {k: v + 1e-3 * torch.randn(v.shape, generator=generator) for k, v in trained.items()}
        return noisy, n, {"rounds": float(state["rounds"])}


class ConstantUser:
    """Returns every weight set to ``value``: with ``count``, as ``(state_dict, count)``, else the state_dict alone."""

    def __init__(self, value: float, count: int | None = None) -> None:
        self.value, self.count = value, count

    def train(self, state_dict: dict[str, torch.Tensor]) -> Any:
        filled = {k: torch.full_like(v, self.value) for k, v in state_dict.items()}
        return filled if self.count is None else (filled, self.count)


class BadUser:
    """Returns something wrong, named by ``mode``."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def train(self, state_dict: dict[str, torch.Tensor]) -> Any:
        trained = dict(state_dict)
        if self.mode == "missing key":
            trained.pop("3.bias")
        elif self.mode == "wrong shape":
            trained["0.weight"] = torch.zeros(2, 2)
        elif self.mode == "not a dict":
            return [v for v in trained.values()], 5
        elif self.mode == "no count":
            return trained
        return trained, 5
