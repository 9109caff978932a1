"""The attack in the round: the malicious clients' updates replaced before they are encoded and sent, and what the
round reports about them (``attack/`` metrics, a ``malicious`` flag in each client's row)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from fedsim.attacks.base import Attack
from fedsim.attacks.data_poisoning import Backdoor, DataAttack
from fedsim.client.base import Client
from fedsim.core.types import ClientUpdate, TaskResult
from fedsim.core.update_checks import rejection_reason
from fedsim.data.tensor_data import TensorData


def attack_stage(attack: Attack | None, num_clients: int, seed: int, run_dir: Path | None) -> AttackStage | None:
    """The run's :class:`AttackStage` (None without an attack), its malicious set recorded in ``run_dir``."""
    if attack is None:
        return None
    stage = AttackStage(attack, num_clients=num_clients, seed=seed)
    stage.record(run_dir)
    return stage


class AttackStage:
    """``attack`` over a run of ``num_clients`` clients with seed ``seed``."""

    def __init__(self, attack: Attack, *, num_clients: int, seed: int) -> None:
        self.attack, self.num_clients, self.seed = attack, num_clients, seed
        self._malicious: tuple[int, frozenset[int]] | None = None  # the last round's set: rows ask once per client
        self.backdoor_test: TensorData | None = None  # the triggered test set of a backdoor attack

    def poison_data(
        self, train: TensorData, test: TensorData | None, clients: Sequence[Client]
    ) -> tuple[TensorData, Sequence[Client]]:
        """For a data attack: the training tensors with the malicious clients' poisoned copies and the clients
        pointing at them (and, for a backdoor, the triggered test set); otherwise both unchanged, ``clients`` itself
        (a :class:`~fedsim.client.federation.Population` stays one: no client is built here)."""
        if not isinstance(self.attack, DataAttack):
            return train, clients
        poisoned = self.attack.poisoned_federation(train, clients, self.malicious(0), self.seed)
        if isinstance(self.attack, Backdoor) and test is not None and len(test):
            self.backdoor_test = self.attack.test_set(test)
        return poisoned

    def evaluate(self, accuracy_on: Callable[[TensorData], float]) -> dict[str, float]:
        """``attack/backdoor_success`` (the global model's accuracy on the triggered test set) for a backdoor."""
        if self.backdoor_test is None or len(self.backdoor_test) == 0:
            return {}
        return {"attack/backdoor_success": accuracy_on(self.backdoor_test)}

    def malicious(self, round_num: int) -> frozenset[int]:
        """The malicious clients of ``round_num`` (drawn once per round, however often asked)."""
        if self._malicious is None or self._malicious[0] != round_num:
            self._malicious = (round_num, self.attack.malicious(self.seed, round_num, self.num_clients))
        return self._malicious[1]

    def record(self, run_dir: Path | None) -> None:
        """Write ``malicious.json`` (the fixed set, or a note that it is drawn every round) into ``run_dir``."""
        if run_dir is None:
            return
        fixed = None if self.attack.per_round else sorted(self.malicious(0))
        text = json.dumps({"attack": repr(self.attack), "per_round": self.attack.per_round, "clients": fixed}, indent=1)
        from fedsim.core.checkpoint import write_text_atomic

        write_text_atomic(Path(run_dir) / "malicious.json", text + "\n")

    def apply(self, results: Sequence[TaskResult], received: torch.Tensor) -> list[TaskResult]:
        """A synchronous round's results with the malicious clients' updates replaced (failures, and updates the
        server will reject anyway, pass unchanged and are not shown to the attack)."""
        sound = [r for r in results if isinstance(r, ClientUpdate) and rejection_reason(r, received) is None]
        if not sound:
            return list(results)
        poisoned = self._poisoned(sound, [received] * len(sound), sound[0].round_num)
        return [poisoned.get(r.client_id, r) for r in results]

    def apply_buffer(
        self, updates: Sequence[ClientUpdate], received: Sequence[torch.Tensor], round_num: int
    ) -> list[ClientUpdate]:
        """An asynchronous server step's buffer with the malicious clients' updates replaced: ``updates`` are the
        sound, honest updates the step consumes (one per client), each trained from its own ``received`` weights (the
        model version it started from, as it received it). ``round_num`` is the server step: it picks a
        ``per_round`` malicious set and seeds the attack's draws, and an omniscient attack sees the buffer."""
        poisoned = self._poisoned(updates, received, round_num)
        return [poisoned.get(u.client_id, u) for u in updates]

    def _poisoned(
        self, updates: Sequence[ClientUpdate], received: Sequence[torch.Tensor], round_num: int
    ) -> dict[int, ClientUpdate]:
        """The malicious clients' replacement updates, by client id: each sends its received weights plus the
        attack's delta, which it computes from every update's delta (trained − received), in client-id order."""
        base = {u.client_id: r for u, r in zip(updates, received, strict=True)}
        deltas = {u.client_id: u.params - base[u.client_id] for u in sorted(updates, key=lambda u: u.client_id)}
        crafted = self.attack.poison(deltas, self.malicious(round_num), self.seed, round_num)
        return {
            u.client_id: replace(u, params=base[u.client_id] + crafted[u.client_id])
            for u in updates
            if u.client_id in crafted
        }

    def round_metrics(
        self, round_num: int, sampled: Sequence[int], aggregated: Sequence[ClientUpdate], selected: Sequence[int] | None
    ) -> dict[str, float]:
        """``attack/malicious_sampled``, ``attack/malicious_aggregated`` (that reached the strategy) and, for a rule
        that keeps some updates (Krum), ``attack/malicious_selected``."""
        bad = self.malicious(round_num)
        metrics = {
            "attack/malicious_sampled": float(len(bad & set(sampled))),
            "attack/malicious_aggregated": float(sum(u.client_id in bad for u in aggregated)),
        }
        if selected is not None:
            metrics["attack/malicious_selected"] = float(len(bad & set(selected)))
        return metrics
