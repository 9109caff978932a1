"""Client subclasses that misbehave on purpose, importable by spawned worker processes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedsim.client.base import Client

if TYPE_CHECKING:
    import torch


class RaisingClient(Client):
    """Raises on every fit when its id is in ``bad_ids``."""

    def __init__(self, *args: Any, bad_ids: tuple[int, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bad_ids = bad_ids

    def fit(self, model, data, **kwargs):  # type: ignore[no-untyped-def]
        if self.client_id in self.bad_ids:
            raise ValueError(f"client {self.client_id} fails on purpose")
        return super().fit(model, data, **kwargs)


class KillOnceClient(Client):
    """The first time client ``victim`` trains (tracked by a marker file), its worker SIGKILLs itself mid-task."""

    def __init__(self, *args: Any, victim: int = -1, marker: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.victim, self.marker = victim, marker

    def fit(self, model, data, **kwargs):  # type: ignore[no-untyped-def]
        if self.client_id == self.victim and not Path(self.marker).exists():
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().fit(model, data, **kwargs)


class HangClient(Client):
    """Client ``victim`` hangs: once (``always=False``, tracked by a marker file) or every time."""

    def __init__(self, *args: Any, victim: int = -1, marker: str = "", always: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.victim, self.marker, self.always = victim, marker, always

    def fit(self, model, data, **kwargs):  # type: ignore[no-untyped-def]
        if self.client_id == self.victim and (self.always or not Path(self.marker).exists()):
            Path(self.marker).write_text(str(os.getpid()))
            time.sleep(3600)
        return super().fit(model, data, **kwargs)


class PrintingClient(Client):
    """Prints a line from client code (it must land in the worker's log, tagged)."""

    def fit(self, model, data, **kwargs):  # type: ignore[no-untyped-def]
        print(f"hello from client {self.client_id}")
        return super().fit(model, data, **kwargs)


def dropout_mlp(input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    """A small MLP with dropout: its training draws from torch's global RNG, which every task seeds."""
    import torch

    return torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(input_shape[0], 32),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.5),
        torch.nn.Linear(32, num_classes),
    )


class MalformedClient(Client):
    """Client ``victim`` returns a malformed update: weights of the wrong shape (``kind="shape"``) or a list."""

    def __init__(self, *args: Any, victim: int = -1, kind: str = "shape", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.victim, self.kind = victim, kind

    def fit(self, model, data, **kwargs):  # type: ignore[no-untyped-def]
        import dataclasses

        update = super().fit(model, data, **kwargs)
        if self.client_id != self.victim:
            return update
        params = update.params[:-3] if self.kind == "shape" else update.params.tolist()[:4]
        return dataclasses.replace(update, params=params)


def mlp_that_kills_its_worker(marker: str, times: int) -> torch.nn.Module:
    """A 2NN factory whose first ``times`` calls (counted in the file ``marker``) SIGKILL the calling process:
    a worker killed while it starts. Later calls build the model."""
    from fedsim.models import MLP2NN

    path = Path(marker)
    calls = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(calls))
    if calls <= times:
        os.kill(os.getpid(), signal.SIGKILL)
    return MLP2NN(input_shape=(60,), num_classes=10, hidden=32)


def mlp_that_cannot_import() -> torch.nn.Module:
    """A model factory whose import fails, as a worker missing one of the user's modules would."""
    import fedsim_no_such_module  # noqa: F401

    raise AssertionError("unreachable")


class NodeLossClient(Client):
    """Appends the Ray node it trains on to ``nodes_log``. The first task of round 2 that lands on node
    ``victim_node`` writes ``marker`` and waits there (up to 60 s) for the test to remove that node."""

    def __init__(self, *args: Any, victim_node: str = "", marker: str = "", nodes_log: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.victim_node, self.marker, self.nodes_log = victim_node, marker, nodes_log

    def fit(self, model, data, **kwargs):  # type: ignore[no-untyped-def]
        import ray

        node = ray.get_runtime_context().get_node_id()
        with open(self.nodes_log, "a") as log:
            log.write(f"{kwargs['round_num']} {self.client_id} {node}\n")
        if kwargs["round_num"] == 2 and node == self.victim_node and not Path(self.marker).exists():
            Path(self.marker).write_text(str(self.client_id))
            time.sleep(60)
        return super().fit(model, data, **kwargs)


def cumulative_bn_mlp(input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    """An MLP whose BatchNorm keeps a cumulative average (``momentum=None``): its running statistics depend on
    ``num_batches_tracked``, an integer buffer that fedsim does not federate."""
    import torch

    return torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(input_shape[0], 32),
        torch.nn.BatchNorm1d(32, momentum=None),
        torch.nn.ReLU(),
        torch.nn.Linear(32, num_classes),
    )


class SlowClient(Client):
    """Every task takes ``delay_s`` longer (asleep, so it costs the machine nothing): a client whose training costs
    wall time that workers in parallel divide, for executor=auto's choice. Trains exactly as a plain Client."""

    def __init__(self, *args: Any, delay_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delay_s = delay_s

    def fit(self, model, data, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(self.delay_s)
        return super().fit(model, data, **kwargs)
