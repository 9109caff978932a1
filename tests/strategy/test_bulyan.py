"""Bulyan (El Mhamdi et al., ICML 2018): hand-computed selections and aggregates, ties and order independence, the
4f+3 requirement, and attacked runs composed as on the command line (process workers and a resume bitwise)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from fedsim.cli.run import build_server, compose, run_config
from fedsim.core.types import ClientUpdate
from fedsim.strategy import Bulyan, Krum
from fedsim.strategy.bulyan import bulyan_select, closest_to_median_mean

# 1-D weights of clients 0..6; client 6 is far away
LINE = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 100.0]


def _updates(values: list[float], ids: list[int] | None = None) -> list[ClientUpdate]:
    ids = ids if ids is not None else list(range(len(values)))
    return [ClientUpdate(i, 1, torch.tensor([v]), 1) for i, v in zip(ids, values, strict=True)]


def test_selection_known_answer() -> None:
    # f = 1, θ = 5 picks. Pick 1 (4 neighbours): scores 30, 15, 10, 10, 15, 30, huge -> x=2 (tie with 3: lower index).
    # Pick 2 (3 neighbours) among {0,1,3,4,5,100}: 26, 14, 9, 11, 21 -> x=3. Pick 3 (2): 17, 10, 10, 17 -> x=1.
    # Pick 4 (1 neighbour) among {0,4,5,100}: 16, 1, 1 -> x=4. Pick 5 (1) among {0,5,100}: 25, 25 -> x=0.
    assert bulyan_select(torch.tensor(LINE).unsqueeze(1), f=1) == [2, 3, 1, 4, 0]


def test_aggregation_step_known_answer() -> None:
    # column 0: median 2, the 3 closest are 1, 2, 3 -> 2; column 1: values 10, 0, 0, 1, 7, median 1,
    # distances 9, 1, 1, 0, 6 -> 1, 0, 0 -> 1/3
    stack = torch.tensor([[0.0, 10.0], [1.0, 0.0], [2.0, 0.0], [3.0, 1.0], [4.0, 7.0]])
    # sums of small integers are exact; each coordinate is one correctly rounded division, as 1 / 3 is
    assert torch.equal(closest_to_median_mean(stack, 3), torch.tensor([2.0, 1 / 3], dtype=torch.float64))
    # equal distances to the median (0 and 2 around 1) go to the lower row; an even count's median is the mean of
    # the middles
    assert torch.equal(
        closest_to_median_mean(torch.tensor([[0.0], [2.0]]), 1), torch.tensor([0.0], dtype=torch.float64)
    )
    with pytest.raises(ValueError, match="1 <= beta <= n"):
        closest_to_median_mean(stack, 6)


def test_rule_known_answer_and_what_it_reports() -> None:
    # S = {0, 1, 2, 3, 4}, median 2, β = θ - 2f = 3: mean(1, 2, 3) = 2; 5 and 100 are not picked
    strategy = Bulyan(f=1)
    assert torch.equal(strategy.aggregate(1, torch.zeros(1), _updates(LINE)), torch.tensor([2.0]))
    assert strategy.selected_client_ids == [0, 1, 2, 3, 4]
    assert strategy.client_metrics(1) == {i: {"selected": float(i <= 4)} for i in range(7)}


def test_attackers_krum_picks_cannot_move_a_coordinate_out_of_the_honest_range() -> None:
    # the paper's attack on Krum: f = 2 identical attackers at the honest mean, shifted by 0.4 in one coordinate (the
    # honest values there span -0.10..0.19). Krum's scores favour the attackers' pair, so Krum returns the shift;
    # Bulyan picks both attackers too, but its per-coordinate trimmed mean keeps the coordinate inside the honest range
    gen = torch.Generator().manual_seed(0)
    honest = torch.stack([torch.randn(20, generator=gen) * 0.1 for _ in range(9)])
    attacker = honest.mean(0)
    attacker[7] += 0.4
    updates = [ClientUpdate(i, 1, w, 1) for i, w in enumerate([attacker, attacker.clone(), *honest])]
    low, high = honest.min(0).values, honest.max(0).values
    krum = Krum(f=2)
    assert krum.aggregate(1, torch.zeros(20), updates)[7] > high[7] and krum.selected_client_ids == [0]
    bulyan = Bulyan(f=2)
    new = bulyan.aggregate(1, torch.zeros(20), updates)
    assert {0, 1} <= set(bulyan.selected_client_ids or ())
    assert bool(((new >= low) & (new <= high)).all())


def test_the_order_of_updates_does_not_matter_bitwise() -> None:
    gen = torch.Generator().manual_seed(1)
    values = [torch.randn(6, generator=gen) for _ in range(8)]
    reference = Bulyan(f=1).aggregate(1, torch.zeros(6), [ClientUpdate(i, 1, v, 1) for i, v in enumerate(values)])
    for order in itertools.islice(itertools.permutations(range(8)), 0, 40000, 5000):
        shuffled = [ClientUpdate(i, 1, values[i], 1) for i in order]
        assert torch.equal(Bulyan(f=1).aggregate(1, torch.zeros(6), shuffled), reference)


def test_too_few_updates_and_bad_settings_are_refused_in_one_line() -> None:
    with pytest.raises(
        ValueError,
        match=r"^strategy=bulyan needs at least 4f\+3 = 11 clients per round \(f=2\) but "
        r"clients_per_round is 10; lower strategy.f or raise clients_per_round$",
    ):
        Bulyan(f=2).check(10)
    with pytest.raises(ValueError, match=r"but the round has 6"):
        Bulyan(f=1).aggregate(1, torch.zeros(1), _updates(LINE[:6]))
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match=r"^strategy\.f must be an integer >= 0 \(got .+\)$"):
            Bulyan(f=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"strategy=bulyan needs at least 4f\+3 = 7"):
        build_server(compose(["strategy=bulyan", "clients_per_round=6", "logger=quiet"]))


ATTACKED = [
    "strategy=bulyan",
    "clients_per_round=8",
    "num_rounds=4",
    "logger=quiet",
    "model=mlp",
    "attack=alie",
    "attack.fraction=0.2",
]


@pytest.fixture(scope="module")
def attacked_reference():
    return build_server(compose(ATTACKED)).run()


def test_process_workers_give_the_serial_run(attacked_reference) -> None:  # noqa: ANN001
    assert sum(r["attack/malicious_sampled"] for r in attacked_reference.history) > 0
    assert all(0 <= r["attack/malicious_selected"] <= r["attack/malicious_sampled"] for r in attacked_reference.history)
    result = build_server(compose([*ATTACKED, "executor=process", "executor.devices=cpu", "executor.workers=2"])).run()
    assert torch.equal(result.params, attacked_reference.params)
    assert [r["attack/malicious_selected"] for r in result.history] == [
        r["attack/malicious_selected"] for r in attacked_reference.history
    ]


def test_a_resumed_run_is_bitwise_the_uninterrupted_one(tmp_path: Path, attacked_reference) -> None:  # noqa: ANN001
    run_config(compose([*ATTACKED, "num_rounds=2", "checkpoint_every=1"]), run_dir=tmp_path)
    resumed = run_config(compose([*ATTACKED, "resume=true"]), run_dir=tmp_path)
    assert torch.equal(resumed.params, attacked_reference.params)
