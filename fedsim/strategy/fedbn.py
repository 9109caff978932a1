"""FedBN: federated weights, local BatchNorm that never leaves its client.

Li, Jiang, Zhang, Kamp, Dou. "FedBN: Federated Learning on Non-IID Features via Local Batch Normalization."
ICLR 2021. FedAvg on every entry of the model except its normalisation layers (BatchNorm's ``weight``,
``bias``, ``running_mean`` and ``running_var``), which each client keeps, so that clients whose features
differ (scanners, image styles) each normalise with their own statistics:

    client k:  load its own normalisation entries (the global model's, the first time), train,
               keep the trained normalisation entries in its client state
    server:    other entries ← Σₖ (nₖ / n) entriesₖ;   the global model's normalisation entries stay as they were

``norm_layers`` is a regular expression over ``state_dict`` entry names; ``None`` (the default) finds them
in the parameter layout told at :meth:`setup`: every entry of a module that has a ``running_mean`` or
``running_var`` buffer (BatchNorm, and InstanceNorm with ``track_running_stats=True``). Normalisation without
running statistics (GroupNorm, LayerNorm, BatchNorm with ``track_running_stats=False``) is not found that
way: name its entries with ``norm_layers`` (``model=resnet18``'s GroupNorm entries are ``stem.1.*``,
``blocks.<i>.norm1.*``, ``blocks.<i>.norm2.*`` and ``blocks.<i>.shortcut.1.*``). A model with nothing to keep
local is refused before any work.

Non-float buffers (BatchNorm's ``num_batches_tracked``) are not in the flat vector nor in the client state:
every executor puts back, before each task, the value they had when the model was built (see
:mod:`fedsim.core.params`). BatchNorm with a ``momentum`` (the default, 0.1) does not read that counter, so a
client's running statistics carry over from task to task as they would in one long training. With
``momentum=None`` (a cumulative average weighted by the counter) the counter restarts at every task and
the first batch of each task replaces the client's kept statistics instead of joining their average.

The centralized ``eval/`` metrics evaluate the global model, whose normalisation entries are the initial
ones (running mean 0, variance 1): judge FedBN by its clients' own models (``eval_personal/``, which
:meth:`LocalNorms.personalise` provides). ``executor=vmap`` cannot train BatchNorm; use ``executor=process``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fedsim.core.params import ParamLayout
from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import LocalTraining, Strategy
from fedsim.strategy.context import RunContext
from fedsim.strategy.functional import weighted_average

STATE_KEY = "fedbn_norm_layers"
_RUNNING_STATS = ("running_mean", "running_var")


class LocalNorms(LocalTraining):
    """Client half: the client's own normalisation entries (``names``) go into the model before training and
    back into its state afterwards (``state[STATE_KEY]``: entry name → tensor)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)

    def begin_task(self, model: nn.Module, config: dict[str, Any], state: dict[str, Any]) -> None:
        self.personalise(model, state)  # the first task of a client starts from the global model's entries

    def end_task(self, model: nn.Module, config: dict[str, Any], state: dict[str, Any]) -> None:
        entries = model.state_dict()
        state[STATE_KEY] = {name: entries[name].detach().cpu().clone() for name in self.names}

    def personalise(self, model: nn.Module, state: dict[str, Any]) -> bool:
        own = state.get(STATE_KEY)
        if not own:
            return False  # never trained: its model is the global one
        entries = model.state_dict()
        with torch.no_grad():
            for name, value in own.items():
                entries[name].copy_(value)
        return True


class FedBN(Strategy):
    """FedAvg on every entry but the normalisation layers' (found, or matched by ``norm_layers``), which stay
    on the clients."""

    keeps_stragglers = False

    def __init__(self, *, norm_layers: str | None = None) -> None:
        if norm_layers is not None:
            try:
                re.compile(norm_layers)
            except re.error as error:
                raise ValueError(
                    f"strategy.norm_layers is not a regular expression ({error}): {norm_layers!r}"
                ) from None
        self.norm_layers = norm_layers
        self.names: tuple[str, ...] = ()  # the normalisation entries, from setup()
        self.local: torch.Tensor | None = None  # boolean mask over the flat vector, from setup()

    def setup(self, context: RunContext) -> None:
        layout = context.layout
        names = layout.matching(self.norm_layers) if self.norm_layers is not None else norm_entries(layout)
        if not names and self.norm_layers is None:
            raise ValueError(
                "FedBN needs a model with BatchNorm, e.g. model=cnn_bn (this one has no running_mean "
                "buffer; strategy.norm_layers can name another model's normalisation entries)"
            )
        if not names:
            raise ValueError(
                f"strategy.norm_layers={self.norm_layers!r} matches no entry of the model "
                f"(entries: {', '.join(layout.names)})"
            )
        if len(names) == len(layout.names):
            raise ValueError(
                f"strategy.norm_layers={self.norm_layers!r} selects every entry of the model: "
                "nothing would be federated"
            )
        self.names, self.local = names, layout.mask(names)

    def personal_entries(self) -> torch.Tensor | None:
        """The normalisation entries: never uploaded (None before :meth:`setup`)."""
        return self.local

    def local_training(self) -> LocalTraining:
        if self.local is None:
            raise RuntimeError("FedBN.local_training called before setup(); the Server calls setup() first")
        return LocalNorms(self.names)

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        if self.local is None:
            raise RuntimeError("FedBN.aggregate called before setup(); the Server calls setup() before round 1")
        average = weighted_average([u.params for u in updates], [u.num_examples for u in updates])
        return torch.where(self.local, global_params, average)

    def round_metrics(self, round_num: int) -> dict[str, float]:
        return {
            "local_fraction": int(self.local.sum()) / self.local.numel() if self.local is not None else float("nan")
        }


def norm_entries(layout: ParamLayout) -> tuple[str, ...]:
    """The entries of every module that has running statistics among the layout's buffers (``features.1.weight``,
    ``features.1.bias``, ``features.1.running_mean``, ... for a BatchNorm ``features.1``), in flat-vector order."""
    modules = {_module(name) for name in layout.buffers if name.rsplit(".", 1)[-1] in _RUNNING_STATS}
    return tuple(name for name in layout.names if _module(name) in modules)


def _module(name: str) -> str:
    """The module prefix of an entry name (``features.1.weight`` → ``features.1``; ``weight`` → ``""``)."""
    return name.rsplit(".", 1)[0] if "." in name else ""
