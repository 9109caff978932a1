"""Data-poisoning attacks: malicious clients train, as usual, on poisoned copies of their own examples.

* :class:`LabelFlip` (Tolpegin, Truex, Gursoy and Liu, "Data Poisoning Attacks Against Federated Learning Systems",
  ESORICS 2020): the labels of the malicious clients' examples of class ``source`` become ``target``; without a
  source class, every label y becomes C − 1 − y.
* :class:`Backdoor` (Bagdasaryan, Veit, Hua, Estrin and Shmatikov, "How To Backdoor Federated Learning", AISTATS
  2020, the pixel-pattern variant): a ``poison_fraction`` of each malicious client's examples (drawn from the seed)
  carry a trigger and the label ``target``. The trigger is a ``trigger_size``² square of ``trigger_value`` in the
  bottom-right corner of every channel of an image, or the last ``trigger_size`` features of a flat example.
  Success is measured on the centralized test set: ``attack/backdoor_success`` is the share of its examples whose
  label is not ``target`` that the global model classifies as ``target`` once triggered (every evaluated round).

How: before the run, the poisoned copies are appended to the training tensors and the malicious clients' training
indices point at them (their test indices are untouched). Training, every executor and resume then need nothing
more; the set of malicious clients must therefore be fixed for the run (``per_round=false``).
"""

from __future__ import annotations

import copy
import math
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch

from fedsim.attacks.base import Attack
from fedsim.client.base import Client
from fedsim.core.checks import integer, within
from fedsim.core.seeding import attack_seed
from fedsim.data.tensor_data import TensorData


class DataAttack(Attack):
    """An attack on the malicious clients' training data; their updates are sent as trained."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.per_round:
            raise ValueError(
                f"attack.per_round=true: {type(self).__name__} poisons the malicious clients' data once, "
                "before the run; use attack.per_round=false"
            )

    def poison(
        self, deltas: Mapping[int, torch.Tensor], malicious: frozenset[int], seed: int, round_num: int
    ) -> dict[int, torch.Tensor]:
        return {}

    @abstractmethod
    def poison_rows(
        self, x: torch.Tensor, y: torch.Tensor, num_classes: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Poisoned copies of one client's training rows ``x``, ``y`` (new tensors)."""

    def check(self, data: TensorData) -> None:
        """Refuse, in one line, data this attack cannot poison (called before the run)."""

    def poisoned_federation(
        self, data: TensorData, clients: Sequence[Client], malicious: frozenset[int], seed: int
    ) -> tuple[TensorData, list[Client]]:
        """The training tensors with the malicious clients' poisoned copies appended, and the clients with theirs
        pointing at them."""
        self.check(data)
        xs, ys, out = [data.x], [data.y], list(clients)
        offset = len(data)
        for cid in sorted(malicious):
            rows = torch.from_numpy(clients[cid].train_indices)
            x, y = self.poison_rows(
                data.x[rows], data.y[rows], data.num_classes, torch.Generator().manual_seed(attack_seed(seed, 0, cid))
            )
            poisoned = copy.copy(clients[cid])
            poisoned.train_indices = np.arange(offset, offset + len(rows), dtype=np.int64)
            out[cid], offset = poisoned, offset + len(rows)
            xs.append(x)
            ys.append(y)
        groups = None if data.groups is None else np.concatenate([data.groups, *[np.full(len(y), -1) for y in ys[1:]]])
        return TensorData(torch.cat(xs), torch.cat(ys), data.num_classes, groups), out


class LabelFlip(DataAttack):
    """Labels ``source`` → ``target`` (None, None: every y → C − 1 − y)."""

    def __init__(self, *, source: int | None = None, target: int | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)
        if (source is None) != (target is None):
            raise ValueError("attack.source and attack.target go together (both null: every label y becomes C-1-y)")
        self.source, self.target = source, target

    def poison_rows(
        self, x: torch.Tensor, y: torch.Tensor, num_classes: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.source is None:
            return x.clone(), num_classes - 1 - y
        assert self.target is not None  # __init__: source and target go together
        return x.clone(), torch.where(y == self.source, torch.full_like(y, int(self.target)), y)

    def check(self, data: TensorData) -> None:
        for name, value in (("source", self.source), ("target", self.target)):
            if value is not None and not 0 <= value < data.num_classes:
                raise ValueError(f"attack.{name}={value} is not a class of the data (0..{data.num_classes - 1})")


class Backdoor(DataAttack):
    """A ``poison_fraction`` of each malicious client's examples triggered and labelled ``target``."""

    def __init__(
        self,
        *,
        target: int = 0,
        poison_fraction: float = 0.5,
        trigger_size: int = 3,
        trigger_value: float | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)
        within("attack.poison_fraction", poison_fraction, "(0, 1]")
        integer("attack.trigger_size", trigger_size, 1)
        if trigger_value is not None and not math.isfinite(trigger_value):
            raise ValueError(f"attack.trigger_value must be a finite number or null (got {trigger_value!r})")
        self.target, self.poison_fraction, self.trigger_size, self.trigger_value = (
            target,
            poison_fraction,
            trigger_size,
            trigger_value,
        )
        self._value = trigger_value

    def check(self, data: TensorData) -> None:
        if data.x.dtype != torch.float32:
            raise ValueError(f"attack=backdoor needs float inputs (images or features), not {data.x.dtype} token ids")
        if not 0 <= self.target < data.num_classes:
            raise ValueError(f"attack.target={self.target} is not a class of the data (0..{data.num_classes - 1})")
        stamped = tuple(data.x.shape[-2:]) if data.x.ndim >= 4 else tuple(data.x.shape[1:2])  # see trigger()
        if stamped and self.trigger_size > min(stamped):
            what = "×".join(map(str, stamped)) + (" images" if len(stamped) == 2 else " features")
            raise ValueError(
                f"attack.trigger_size={self.trigger_size} does not fit the data's {what}: it must be between 1 "
                f"and {min(stamped)}"
            )
        if self._value is None:
            self._value = float(data.x.max())  # the brightest value of the data: a visible pattern

    def trigger(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` with the trigger stamped on (a copy)."""
        out = x.clone()
        s = self.trigger_size
        value = cast(float, self._value)  # given, or set by check() before the run
        if out.ndim >= 4:
            out[..., -s:, -s:] = value
        else:
            out[:, -s:] = value
        return out

    def poison_rows(
        self, x: torch.Tensor, y: torch.Tensor, num_classes: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        count = max(1, round(self.poison_fraction * len(y))) if len(y) else 0
        chosen = torch.randperm(len(y), generator=generator)[:count]
        x, y = x.clone(), y.clone()
        x[chosen] = self.trigger(x[chosen])
        y[chosen] = self.target
        return x, y

    def test_set(self, test: TensorData) -> TensorData:
        """The centralized test examples not of class ``target``, triggered and labelled ``target``: a model's
        accuracy on them is the attack's success rate."""
        keep = test.y != self.target
        x = self.trigger(test.x[keep])
        return TensorData(x, torch.full((len(x),), self.target, dtype=torch.int64), test.num_classes)
