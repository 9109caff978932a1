"""Zeno (Xie, Koyejo, Gupta, ICML 2019) on fedsim's root dataset: the keep rule's known answers, scores from the
root loss, attacked runs that drop every sign-flipped or IPM update, the same weights under process workers and after
a resume, and one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedsim.cli.run import build_server, compose, run_config
from fedsim.core.types import ClientUpdate
from fedsim.strategy import Zeno
from fedsim.strategy.zeno import zeno_keep

# Synthetic(0, 0): the devices share one model, so an honest change lowers the loss on the server's root examples
IID = ["strategy=zeno", "data.alpha=0", "data.beta=0", "clients_per_round=8", "logger=quiet"]
ATTACKED = [*IID, "num_rounds=4", "strategy.b=3", "attack=sign_flip", "attack.fraction=0.3"]


def test_keep_rule_known_answers() -> None:
    assert zeno_keep([0.3, -1.0, 0.5, 0.1], b=1) == [0, 2, 3]  # -1.0 dropped
    assert zeno_keep([0.3, -1.0, 0.5, 0.1], b=2) == [0, 2]
    assert zeno_keep([0.2, 0.2, 0.2], b=1) == [0, 1]  # equal scores: the lower index stays
    assert zeno_keep([0.2, 0.1], b=0) == [0, 1]


def test_scores_are_the_root_loss_decrease_minus_the_length_penalty() -> None:
    server = build_server(compose([*IID, "num_rounds=1", "strategy.rho=0.01"]))
    strategy: Zeno = server.strategy
    w = server.params
    good = strategy.root.train(1, w)  # trained on the root examples: lowers their loss
    bad = (w.double() - 10 * (good.double() - w.double())).float()  # the opposite way, 10 times as far
    updates = [ClientUpdate(0, 1, bad, 10), ClientUpdate(1, 1, good, 10), ClientUpdate(2, 1, good.clone(), 10)]
    new = strategy.aggregate(1, w, updates)
    base = strategy.root.loss(w)
    for client_id, weights in ((0, bad), (1, good)):
        change = weights.double() - w.double()
        expected = base - strategy.root.loss(weights) - 0.01 * float(change.dot(change))
        assert strategy.client_metrics(1)[client_id]["score"] == pytest.approx(expected, rel=1e-12)
    assert strategy.client_metrics(1)[1]["score"] > 0 > strategy.client_metrics(1)[0]["score"]
    assert strategy.selected_client_ids == [1, 2] and [v["selected"] for v in strategy.client_metrics(1).values()] == [
        0.0,
        1.0,
        1.0,
    ]
    # the mean of two equal changes d = good - w is d; w + d is within 2^-53 |good| of good in float64, so the cast
    # back to float32 gives good exactly
    assert torch.equal(new, good)
    assert strategy.round_metrics(1)["root_loss"] == base


@pytest.fixture(scope="module")
def attacked_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zeno")


@pytest.fixture(scope="module")
def attacked_reference(attacked_dir: Path):
    return build_server(compose(ATTACKED), attacked_dir).run()


def test_every_sign_flipped_update_is_dropped_and_the_rows_say_why(attacked_dir: Path, attacked_reference) -> None:  # noqa: ANN001
    assert sum(r["attack/malicious_sampled"] for r in attacked_reference.history) > 0
    for record in (json.loads(line) for line in (attacked_dir / "metrics.jsonl").read_text().splitlines()):
        assert record["attack/malicious_selected"] == 0
        kept = [row["strategy"]["score"] for row in record["clients"] if row["strategy"]["selected"] == 1.0]
        dropped = [row["strategy"]["score"] for row in record["clients"] if row["strategy"]["selected"] == 0.0]
        assert len(kept) == 5 and len(dropped) == 3 and min(kept) >= max(dropped)
        assert record["strategy/score_kept_min"] == min(kept) and record["strategy/score_dropped_max"] == max(dropped)


def test_with_every_bad_update_dropped_ipm_and_sign_flipping_give_the_same_model(attacked_reference) -> None:  # noqa: ANN001
    ipm = build_server(compose([*ATTACKED, "attack=ipm", "attack.fraction=0.3", "attack.epsilon=5"])).run()
    assert all(row["attack/malicious_selected"] == 0 for row in ipm.history)
    assert torch.equal(ipm.params, attacked_reference.params)


def test_process_workers_and_a_resume_give_the_serial_weights(tmp_path: Path, attacked_reference) -> None:  # noqa: ANN001
    process = build_server(compose([*ATTACKED, "executor=process", "executor.devices=cpu", "executor.workers=2"])).run()
    assert torch.equal(process.params, attacked_reference.params)
    run_config(compose([*ATTACKED, "num_rounds=2", "checkpoint_every=1"]), run_dir=tmp_path)
    resumed = run_config(compose([*ATTACKED, "resume=true"]), run_dir=tmp_path)
    assert torch.equal(resumed.params, attacked_reference.params)
    assert [r["strategy/root_loss"] for r in resumed.history] == [
        r["strategy/root_loss"] for r in attacked_reference.history
    ]


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["strategy.b=8"], r"^strategy=zeno keeps n - b updates: strategy\.b=8 must be below clients_per_round=8$"),
        (["strategy.b=-1"], r"^strategy\.b must be an integer >= 0 \(got -1\)$"),
        (["strategy.rho=-0.5"], r"^strategy\.rho must be a finite number >= 0 \(got -0\.5\)$"),
        (["strategy.root_size=0"], r"^strategy\.root_size must be an integer >= 1 \(got 0\)$"),
    ],
)
def test_bad_settings_are_refused_in_one_line_before_any_work(overrides: list[str], line: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=line) as raised:
        build_server(compose([*IID, "num_rounds=1", *overrides]), tmp_path / "run")
    assert "\n" not in str(raised.value) and not (tmp_path / "run").exists()
