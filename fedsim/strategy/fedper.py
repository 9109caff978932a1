"""FedPer: federated base layers, personal layers that never leave their client.

Arivazhagan, Aggarwal, Singh, Choudhary. "Federated Learning with Personalization Layers."
arXiv:1912.00818, 2019. The model is split into base layers, averaged across clients as in FedAvg, and
personalisation layers (the top of the network, typically the classifier), which each client keeps:

    client k:  load its own personal layers (the global model's, the first time), train all layers,
               keep the trained personal layers in its client state
    server:    base layers ← Σₖ (nₖ / n) base layersₖ;   the global model's personal layers stay as they were

``personal_layers`` is a regular expression over ``state_dict`` entry names (e.g. ``"^fc2\\."``, or
``"^classifier\\.3\\."`` for the last layer of ``model=cnn``); ``None`` (the default) keeps the model's
last layer personal (the entries that share the last entry's module prefix), as the paper's experiments
do with the classifier. The strategy finds the entries in the parameter layout it is told about at
:meth:`setup`, so it works from the command line with ``strategy._target_=`` alone.
The centralized ``eval/`` metrics evaluate the global model, whose personal layers are the initial ones:
judge FedPer by its clients' personal models, ``eval_personal/...`` (see :mod:`fedsim.client.evaluation`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from fedsim.core.types import ClientUpdate
from fedsim.strategy.base import LocalTraining, Strategy
from fedsim.strategy.context import RunContext
from fedsim.strategy.functional import weighted_average

STATE_KEY = "fedper_personal_layers"


class PersonalLayers(LocalTraining):
    """Client half: the client's own personal layers (``names``) go into the model before training and back
    into its state afterwards (``state[STATE_KEY]``: entry name → tensor)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)

    def begin_task(self, model: nn.Module, config: dict[str, Any], state: dict[str, Any]) -> None:
        self.personalise(model, state)  # a client's first round starts from the global model's personal layers

    def personalise(self, model: nn.Module, state: dict[str, Any]) -> bool:
        own = state.get(STATE_KEY)
        if not own:
            return False
        entries = model.state_dict()
        with torch.no_grad():
            for name, value in own.items():
                entries[name].copy_(value)
        return True

    def end_task(self, model: nn.Module, config: dict[str, Any], state: dict[str, Any]) -> None:
        entries = model.state_dict()
        state[STATE_KEY] = {name: entries[name].detach().cpu().clone() for name in self.names}


class FedPer(Strategy):
    """FedAvg on the entries that ``personal_layers`` does not match; the matched ones stay on the clients."""

    keeps_stragglers = False

    def __init__(self, *, personal_layers: str | None = None) -> None:
        if personal_layers is not None:
            try:
                re.compile(personal_layers)
            except re.error as error:
                raise ValueError(
                    f"strategy.personal_layers is not a regular expression ({error}): {personal_layers!r}"
                ) from None
        self.personal_layers = personal_layers
        self.names: tuple[str, ...] = ()  # the personal entries, from setup()
        self.personal: torch.Tensor | None = None  # boolean mask over the flat vector, from setup()

    def setup(self, context: RunContext) -> None:
        names = context.layout.matching(self.personal_layers or last_layer_pattern(context.layout.names))
        if not names:
            raise ValueError(
                f"strategy.personal_layers={self.personal_layers!r} matches no entry of the model "
                f"(entries: {', '.join(context.layout.names)})"
            )
        if len(names) == len(context.layout.names):
            raise ValueError(
                f"strategy.personal_layers={self.personal_layers!r} matches every entry of the model: "
                "nothing would be federated"
            )
        self.names, self.personal = names, context.layout.mask(names)

    def personal_entries(self) -> torch.Tensor | None:
        """The personal layers: never uploaded (None before :meth:`setup`)."""
        return self.personal

    def local_training(self) -> LocalTraining:
        if self.personal is None:
            raise RuntimeError("FedPer.local_training called before setup(); the Server calls setup() first")
        return PersonalLayers(self.names)

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: Sequence[ClientUpdate]) -> torch.Tensor:
        if self.personal is None:
            raise RuntimeError("FedPer.aggregate called before setup(); the Server calls setup() before round 1")
        average = weighted_average([u.params for u in updates], [u.num_examples for u in updates])
        return torch.where(self.personal, global_params, average)

    def round_metrics(self, round_num: int) -> dict[str, float]:
        return {
            "personal_fraction": int(self.personal.sum()) / self.personal.numel()
            if self.personal is not None
            else float("nan")
        }


def last_layer_pattern(names: Sequence[str]) -> str:
    """A pattern for the entries of the module that holds the last entry (``classifier.3.weight`` →
    ``^classifier\\.3\\.``)."""
    module = names[-1].rsplit(".", 1)[0] + "." if "." in names[-1] else names[-1]
    return "^" + re.escape(module)
