"""FLTrust (Cao et al., NDSS 2021): the rule's known answers, the root dataset (drawn once, clean, from the clients'
training examples), the server's own training, attacked runs that exclude every sign-flipped or IPM update, the same
weights under process workers and after a resume, and one-line refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsim.cli.run import build_server, compose, run_config
from fedsim.core.types import ClientUpdate
from fedsim.strategy import FLTrust
from fedsim.strategy.fltrust import fltrust_step, trust_scores

# Synthetic(0, 0): every device has the same model and feature distribution, so honest changes point roughly the way
# of the server's root update
IID = ["strategy=fltrust", "data.alpha=0", "data.beta=0", "clients_per_round=8", "logger=quiet"]
ATTACKED = [*IID, "num_rounds=4", "attack=sign_flip", "attack.fraction=0.3"]


def _d(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_trust_scores_known_answers() -> None:
    root = _d(3.0, 4.0)  # ‖Δ₀‖ = 5
    # cos = 1; (0,-2): -8/10 -> 0; (4,0): 12/20 = 0.6; the zero change has no direction -> 0
    assert trust_scores([_d(6.0, 8.0), _d(0.0, -2.0), _d(4.0, 0.0), _d(0.0, 0.0)], root) == pytest.approx(
        [1.0, 0.0, 0.6, 0.0]
    )


def test_step_known_answer() -> None:
    # (6,8) rescaled to length 5 is (3,4), weight 1; (4,0) rescaled is (5,0), weight 0.6; (0,-2) weight 0
    # step = (1·(3,4) + 0.6·(5,0)) / 1.6 = (6, 4) / 1.6 = (3.75, 2.5)
    step, scores = fltrust_step([_d(6.0, 8.0), _d(0.0, -2.0), _d(4.0, 0.0)], _d(3.0, 4.0))
    # at most 6 rounded float64 operations lie between the inputs and each coordinate: 8 half-ulps, relative
    torch.testing.assert_close(step, _d(3.75, 2.5), rtol=8 * 2.0**-53, atol=0)
    assert scores == pytest.approx([1.0, 0.0, 0.6])


def test_a_boosted_change_moves_the_model_no_further_than_the_root_update() -> None:
    root = _d(0.1, -0.2, 0.3)
    step, _ = fltrust_step([root * 1e6], root)
    # two norms (a sum of 3 squares and a root each), a dot product, a product, a quotient and the rescaling: < 16
    # rounded float64 operations, each at most half an ulp
    torch.testing.assert_close(step, root, rtol=16 * 2.0**-53, atol=0)


@pytest.mark.parametrize("root", [_d(1.0, 1.0), _d(0.0, 0.0)], ids=["all_distrusted", "zero_root_update"])
def test_no_trusted_change_gives_a_zero_step(root: torch.Tensor) -> None:
    step, scores = fltrust_step([_d(-1.0, -1.0), _d(-2.0, 0.5)], root)
    assert torch.equal(step, _d(0.0, 0.0)) and scores == [0.0, 0.0]


def test_the_root_dataset_is_drawn_once_from_the_clients_training_examples() -> None:
    server = build_server(compose([*IID, "num_rounds=1"]))
    root = server.strategy.root
    held = np.concatenate([c.train_indices for c in server.clients])
    assert len(root.indices) == 100 and len(np.unique(root.indices)) == 100
    assert np.array_equal(root.indices, np.sort(root.indices)) and np.isin(root.indices, held).all()
    local_tests = np.concatenate([c.test_indices for c in server.clients])
    assert not np.isin(root.indices, local_tests).any()
    again = build_server(compose([*IID, "num_rounds=1"])).strategy.root.indices
    other_seed = build_server(compose([*IID, "num_rounds=1", "seed=1"])).strategy.root.indices
    assert np.array_equal(again, root.indices) and not np.array_equal(other_seed, root.indices)
    assert root.client.epochs == server.clients[0].epochs and root.client.batch_size == server.clients[0].batch_size


def test_a_context_without_a_root_dataset_is_refused_in_one_line() -> None:
    from fedsim.core.params import ParamLayout
    from fedsim.strategy.context import RunContext

    context = RunContext(
        layout=ParamLayout.of(torch.nn.Linear(1, 1)),
        num_clients=1,
        num_examples=(1,),
        clients_per_round=1,
        num_rounds=1,
        seed=0,
    )
    with pytest.raises(
        ValueError, match=r"^strategy=fltrust needs the server's root dataset; this run context offers none$"
    ):
        FLTrust().setup(context)


def test_the_root_dataset_holds_no_poisoned_copy() -> None:
    server = build_server(compose([*IID, "num_rounds=1", "attack=label_flip", "attack.fraction=0.5"]))
    poisoned_rows = np.concatenate([server.clients[c].train_indices for c in server.parts.attack.malicious(1)])
    clean_rows = len(server.parts.train_data) - len(poisoned_rows)
    assert poisoned_rows.min() == clean_rows  # the poisoned copies are appended after the clean rows
    assert server.strategy.root.indices.max() < clean_rows


def test_the_server_trains_deterministically_and_leaves_the_global_model_alone() -> None:
    server = build_server(compose([*IID, "num_rounds=1"]))
    before = server.params.clone()
    first = server.strategy.root.train(3, server.params)
    assert torch.equal(server.params, before) and not torch.equal(first, before)
    assert torch.equal(server.strategy.root.train(3, server.params), first)  # a pure function of (seed, round)
    assert not torch.equal(server.strategy.root.train(4, server.params), first)  # another batch order


def test_aggregate_keeps_the_honest_direction_and_drops_a_flipped_client() -> None:
    server = build_server(compose([*IID, "num_rounds=1"]))
    strategy: FLTrust = server.strategy
    w = server.params
    root = strategy.root.train(1, w).double() - w.double()
    updates = [
        ClientUpdate(0, 1, (w.double() + 3 * root).float(), 10),  # the root's direction, 3 times as long
        ClientUpdate(1, 1, (w.double() - 50 * root).float(), 10),
    ]  # flipped and boosted
    new = strategy.aggregate(1, w, updates)
    # only client 0 is trusted, rescaled to ‖Δ₀‖: w + Δ₀, up to float32 rounding. Client 0's change carries the
    # rounding e of its float32 weights, |e| <= 2^-24 |w + 3Δ₀|; rescaled by 1/3 it moves each coordinate by at most
    # |e|/3 and the direction by |Δ₀|·‖e‖/(3‖Δ₀‖); the new weights are rounded to float32 once more (2^-24 |w + Δ₀|).
    # Twice that covers the second-order terms and the float64 arithmetic
    honest = w.double() + 3 * root
    bound = (
        2 * 2.0**-24 * (honest.abs() / 3 + root.abs() * honest.norm() / (3 * root.norm()) + (w.double() + root).abs())
    )
    assert bool(((new.double() - (w.double() + root)).abs() <= bound).all())
    assert strategy.selected_client_ids == [0]
    assert strategy.round_metrics(1) == pytest.approx(
        {"trusted_fraction": 0.5, "mean_trust": 0.5, "root_update_norm": float(root.norm())}, rel=1e-6
    )


@pytest.fixture(scope="module")
def attacked_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("attacked")


@pytest.fixture(scope="module")
def attacked_reference(attacked_dir: Path):
    return build_server(compose(ATTACKED), attacked_dir).run()


def test_every_sign_flipped_update_is_distrusted(attacked_reference) -> None:  # noqa: ANN001
    history = attacked_reference.history
    assert sum(row["attack/malicious_sampled"] for row in history) > 0
    for row in history:
        assert row["attack/malicious_selected"] == 0


def test_each_client_row_holds_its_trust_score(attacked_dir: Path, attacked_reference) -> None:  # noqa: ANN001
    records = [json.loads(line) for line in (attacked_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == len(attacked_reference.history)
    for record in records:
        trust = [row["strategy"]["trust"] for row in record["clients"]]
        assert all(t == 0.0 for t, row in zip(trust, record["clients"], strict=True) if row["malicious"])
        assert sum(t > 0 for t in trust) / len(trust) == record["strategy/trusted_fraction"]
        assert sum(trust) / len(trust) == pytest.approx(record["strategy/mean_trust"], rel=1e-12)


def test_with_every_bad_update_distrusted_ipm_and_sign_flipping_give_the_same_model(attacked_reference) -> None:  # noqa: ANN001
    # both attacks only change the malicious clients' updates; FLTrust gives them trust 0, so neither counts
    ipm = build_server(compose([*ATTACKED, "attack=ipm", "attack.fraction=0.3", "attack.epsilon=5"])).run()
    assert all(row["attack/malicious_selected"] == 0 for row in ipm.history)
    assert torch.equal(ipm.params, attacked_reference.params)


def test_process_workers_give_the_serial_weights(attacked_reference) -> None:  # noqa: ANN001
    result = build_server(compose([*ATTACKED, "executor=process", "executor.devices=cpu", "executor.workers=2"])).run()
    assert torch.equal(result.params, attacked_reference.params)
    assert [r["strategy/mean_trust"] for r in result.history] == [
        r["strategy/mean_trust"] for r in attacked_reference.history
    ]


def test_a_resumed_run_is_bitwise_the_uninterrupted_one(tmp_path: Path, attacked_reference) -> None:  # noqa: ANN001
    run_config(compose([*ATTACKED, "num_rounds=2", "checkpoint_every=1"]), run_dir=tmp_path)
    resumed = run_config(compose([*ATTACKED, "resume=true"]), run_dir=tmp_path)
    assert torch.equal(resumed.params, attacked_reference.params)
    assert [r["strategy/mean_trust"] for r in resumed.history] == [
        r["strategy/mean_trust"] for r in attacked_reference.history
    ]


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["strategy.root_size=0"], r"^strategy\.root_size must be an integer >= 1 \(got 0\)$"),
        (
            ["strategy.root_size=100000"],
            r"^strategy\.root_size must be an integer between 1 and the \d+ training examples "
            r"the clients hold \(got 100000\)$",
        ),
        (["strategy.server_lr=0"], r"^strategy\.server_lr must be a finite number > 0 \(got 0\)$"),
        (
            ["dp=central"],
            r"^round: stage 'aggregate' \(the strategy fedsim\.strategy\.fltrust\.FLTrust\) needs the individual",
        ),
    ],
)
def test_bad_settings_are_refused_in_one_line_before_any_work(overrides: list[str], line: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=line) as raised:
        build_server(compose([*IID, "num_rounds=1", *overrides]), tmp_path / "run")
    assert "\n" not in str(raised.value) and not (tmp_path / "run").exists()


def test_the_trust_scores_are_logged_every_round(attacked_reference) -> None:  # noqa: ANN001
    for row in attacked_reference.history:
        assert 0.0 < row["strategy/trusted_fraction"] <= 1.0
        assert 0.0 < row["strategy/mean_trust"] <= row["strategy/trusted_fraction"]
        assert math.isfinite(row["strategy/root_update_norm"]) and row["strategy/root_update_norm"] > 0
