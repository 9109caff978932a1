"""Client subclasses that keep state across rounds, importable by spawned workers and from the command line
(``client._target_=stateful_clients.PersonalClient`` with this folder on PYTHONPATH)."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path
from typing import Any

import torch

from fedsim.client.base import Client


class CountingClient(Client):
    """Counts its accepted rounds in client state and reports the count as the metric ``rounds_trained``."""

    def fit(self, model, data, *, state=None, **kwargs):  # type: ignore[no-untyped-def]
        update = super().fit(model, data, state=state, **kwargs)
        state["rounds"] = state.get("rounds", 0) + 1
        return dataclasses.replace(update, metrics={**update.metrics, "rounds_trained": float(state["rounds"])})


class SelfCountingClient(Client):
    """The same counter kept on ``self``: must be refused under every executor."""

    def fit(self, model, data, **kwargs):  # type: ignore[no-untyped-def]
        self.count = getattr(self, "count", 0) + 1
        return super().fit(model, data, **kwargs)


class PersonalClient(Client):
    """Ditto-style: a personal model in client state, moved a step towards each round's trained weights and
    nudged by the task's own randomness, so that it depends on every round the client took part in."""

    def fit(self, model, data, *, state=None, generator, **kwargs):  # type: ignore[no-untyped-def]
        update = super().fit(model, data, state=state, generator=generator, **kwargs)
        personal = state.get("personal", torch.zeros_like(update.params))
        noise = torch.randn(personal.shape, generator=generator) * 1e-3
        state["personal"] = 0.5 * personal + 0.5 * update.params + noise
        state["history"] = [*state.get("history", []), int(update.round_num)]
        return dataclasses.replace(update, metrics={**update.metrics, "personal_norm": float(state["personal"].norm())})


class KillOnceCountingClient(CountingClient):
    """Client ``victim``'s worker SIGKILLs itself the first time it trains, after it has already changed its
    state copy (tracked by a marker file): the retry must start from the state as committed."""

    def __init__(self, *args: Any, victim: int = -1, marker: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.victim, self.marker = victim, marker

    def fit(self, model, data, *, state=None, **kwargs):  # type: ignore[no-untyped-def]
        if self.client_id == self.victim and not Path(self.marker).exists():
            state["rounds"] = 999  # a change the retry must not see
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().fit(model, data, state=state, **kwargs)


class NaNForClientClient(CountingClient):
    """Client ``bad`` returns NaN weights in round ``bad_round``: the update is rejected, its state must not move."""

    def __init__(self, *args: Any, bad: int = -1, bad_round: int = -1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bad, self.bad_round = bad, bad_round

    def fit(self, model, data, **kwargs):  # type: ignore[no-untyped-def]
        update = super().fit(model, data, **kwargs)
        if self.client_id == self.bad and update.round_num == self.bad_round:
            return dataclasses.replace(update, params=torch.full_like(update.params, float("nan")))
        return update


class BadStateClient(Client):
    """Leaves an object in its state that no checkpoint can hold."""

    def fit(self, model, data, *, state=None, **kwargs):  # type: ignore[no-untyped-def]
        state["optimizer"] = object()
        return super().fit(model, data, state=state, **kwargs)


class AnchoredClient(Client):
    """Keeps the weights its task started from on ``self`` for ``loss`` (a proximal pull), declared as a task
    attribute: allowed, and put back after every task."""

    task_attributes = ("_anchor",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._anchor: list[torch.Tensor] | None = None

    def fit(self, model, data, **kwargs):  # type: ignore[no-untyped-def]
        self._anchor = [p.detach().clone() for p in model.parameters()]
        return super().fit(model, data, **kwargs)

    def loss(self, model, x, y):  # type: ignore[no-untyped-def]
        assert self._anchor is not None
        return super().loss(model, x, y) + 0.05 * sum(
            ((p - a) ** 2).sum() for p, a in zip(model.parameters(), self._anchor, strict=True)
        )
