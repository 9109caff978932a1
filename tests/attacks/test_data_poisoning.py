"""Data poisoning: known answers for label flipping and the backdoor trigger, the poisoned copies the malicious
clients train on, the success rate, and the same weights under process workers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsim.attacks import Backdoor, LabelFlip
from fedsim.cli.run import build_server, compose
from fedsim.client.base import Client
from fedsim.data.tensor_data import TensorData


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def test_label_flip_maps_every_label_or_one_class() -> None:
    x, y = torch.zeros(5, 2), torch.tensor([0, 1, 2, 3, 1])
    assert LabelFlip().poison_rows(x, y, 4, _gen())[1].tolist() == [3, 2, 1, 0, 2]
    assert LabelFlip(source=1, target=3).poison_rows(x, y, 4, _gen())[1].tolist() == [0, 3, 2, 3, 3]
    with pytest.raises(ValueError, match="^attack.source and attack.target go together"):
        LabelFlip(source=1)
    with pytest.raises(ValueError, match="^attack.per_round=true: LabelFlip poisons"):
        LabelFlip(per_round=True)


def test_the_backdoor_stamps_its_square_on_a_share_of_the_rows_and_relabels_them() -> None:
    attack = Backdoor(target=2, poison_fraction=0.5, trigger_size=2, trigger_value=9.0)
    images, labels = torch.zeros(6, 1, 4, 4), torch.tensor([0, 1, 0, 1, 0, 1])
    attack.check(TensorData(images, labels, 3))
    x, y = attack.poison_rows(images, labels, 3, _gen())
    hit = (y == 2).nonzero().view(-1)
    assert len(hit) == 3 and torch.equal(images, torch.zeros(6, 1, 4, 4))  # copies: the data is untouched
    assert torch.all(x[hit][:, :, 2:, 2:] == 9.0) and float(x[hit].sum()) == 3 * 4 * 9.0
    assert float(x.sum()) == 3 * 4 * 9.0  # nothing else changed
    flat = Backdoor(trigger_size=3, trigger_value=1.0).trigger(torch.zeros(2, 5))
    assert flat.tolist() == [[0, 0, 1, 1, 1], [0, 0, 1, 1, 1]]
    with pytest.raises(ValueError, match="^attack=backdoor needs float inputs"):
        Backdoor().check(TensorData(torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), 2))


@pytest.mark.parametrize(
    ("kwargs", "x", "message"),
    [
        (
            {"trigger_size": 5},
            torch.zeros(2, 1, 4, 6),
            "attack.trigger_size=5 does not fit the data's 4×6 images: it must be between 1 and 4",
        ),
        (
            {"trigger_size": 6},
            torch.zeros(2, 5),
            "attack.trigger_size=6 does not fit the data's 5 features: it must be between 1 and 5",
        ),
        ({"trigger_size": 2.5}, torch.zeros(2, 5), "attack.trigger_size must be an integer >= 1 (got 2.5)"),
        (
            {"trigger_value": math.inf},
            torch.zeros(2, 5),
            "attack.trigger_value must be a finite number or null (got inf)",
        ),
        ({"per_round": "no"}, torch.zeros(2, 5), "attack.per_round must be true or false (got 'no')"),
    ],
)
def test_backdoor_settings_out_of_range_are_one_line(kwargs: dict, x: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError) as caught:  # by the constructor, or by check() before the run (the data's shape)
        Backdoor(**kwargs).check(TensorData(x, torch.zeros(len(x), dtype=torch.int64), 2))
    assert str(caught.value) == message


def test_malicious_clients_train_on_appended_poisoned_copies_and_the_others_are_untouched() -> None:
    data = TensorData(torch.arange(12.0).view(6, 2), torch.tensor([0, 1, 2, 0, 1, 2]), 3)
    clients = [Client(0, [0, 1]), Client(1, [2, 3]), Client(2, [4, 5])]
    poisoned, out = LabelFlip().poisoned_federation(data, clients, frozenset({1}), seed=0)
    assert len(poisoned) == 8 and out[0] is clients[0] and out[2] is clients[2]
    assert out[1].train_indices.tolist() == [6, 7] and clients[1].train_indices.tolist() == [2, 3]
    assert torch.equal(poisoned.x[6:], data.x[2:4]) and poisoned.y[6:].tolist() == [0, 2]  # 2 → 0, 0 → 2
    assert np.array_equal(out[1].test_indices, clients[1].test_indices)


BACKDOOR = [
    "num_rounds=3",
    "logger=quiet",
    "clients_per_round=8",
    "model=mlp",
    "attack=backdoor",
    "attack.fraction=0.3",
]


@pytest.fixture(scope="module")
def backdoor_reference():
    return build_server(compose(BACKDOOR)).run()


def test_a_backdoor_run_reports_its_success_rate(backdoor_reference) -> None:  # noqa: ANN001
    rates = [r["attack/backdoor_success"] for r in backdoor_reference.history]
    assert len(rates) == 3 and all(0 <= r <= 1 for r in rates)
    clean = build_server(compose([*BACKDOOR[:4]])).run()
    assert "attack/backdoor_success" not in clean.history[-1]


def test_a_data_attack_gives_the_serial_weights_under_process_workers(backdoor_reference) -> None:  # noqa: ANN001
    result = build_server(compose([*BACKDOOR, "executor=process", "executor.devices=cpu", "executor.workers=3"])).run()
    assert torch.equal(result.params, backdoor_reference.params)
    assert [r["attack/backdoor_success"] for r in result.history] == [
        r["attack/backdoor_success"] for r in backdoor_reference.history
    ]
