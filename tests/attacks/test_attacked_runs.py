"""Attacked runs: the same weights and metrics under every executor, exact resume, the malicious set recorded and
flagged in the client rows but invisible to the strategy, and what Krum kept reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedsim.cli.run import build_server, compose, run_config
from fedsim.core.types import ClientUpdate

SHORT = ["num_rounds=4", "logger=quiet", "clients_per_round=8", "eval_every=2", "model=mlp"]
ALIE = [*SHORT, "attack=alie", "attack.fraction=0.3", "strategy=krum", "strategy.f=2", "strategy.m=2"]


def _measured_free(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "system/"))} for r in history]


@pytest.fixture(scope="module")
def alie_reference():
    return build_server(compose(ALIE)).run()


# three workers for more clients than that: one worker trains several clients in turn (all that a single
# worker would show) while the others' results arrive in any order
def test_an_omniscient_attack_gives_the_serial_weights_under_process_workers(alie_reference) -> None:  # noqa: ANN001
    result = build_server(compose([*ALIE, "executor=process", "executor.devices=cpu", "executor.workers=3"])).run()
    assert torch.equal(result.params, alie_reference.params)
    assert _measured_free(result.history) == _measured_free(alie_reference.history)


def test_resume_continues_an_attacked_run_exactly(tmp_path: Path, alie_reference) -> None:  # noqa: ANN001
    first = tmp_path / "first"
    build_server(compose([*ALIE, "num_rounds=2", "checkpoint_every=1"]), first).run()
    resumed = build_server(compose([*ALIE, f"resume={first}"]), tmp_path / "second").run()
    assert torch.equal(resumed.params, alie_reference.params)
    assert _measured_free(resumed.history) == _measured_free(alie_reference.history)


def test_the_malicious_set_is_recorded_and_flagged_and_krums_choice_counted(tmp_path: Path) -> None:
    result = run_config(compose([*ALIE, "logger.tensorboard=false"]), run_dir=tmp_path)
    recorded = json.loads((tmp_path / "malicious.json").read_text())
    bad = set(recorded["clients"])
    assert len(bad) == 9 and recorded["per_round"] is False  # 30 % of 30 clients
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        flagged = {c["client_id"] for c in row["clients"] if c["malicious"]}
        assert flagged == {c["client_id"] for c in row["clients"]} & bad
        assert row["attack/malicious_sampled"] == len(flagged)
        assert 0 <= row["attack/malicious_selected"] <= 2
        selected = {c["client_id"] for c in row["clients"] if c["strategy"]["selected"] == 1.0}  # Multi-Krum, m = 2
        assert len(selected) == 2 and row["attack/malicious_selected"] == len(selected & flagged)
    assert sum(r["attack/malicious_sampled"] for r in rows) > 0
    assert result.stop_reason == "completed"


def test_the_strategy_cannot_tell_malicious_updates_apart() -> None:
    server = build_server(compose(ALIE))
    seen: list[list[ClientUpdate]] = []
    aggregate = server.strategy.aggregate
    server.strategy.aggregate = lambda r, g, updates: (seen.append(list(updates)), aggregate(r, g, updates))[1]
    server.run()
    bad = server.parts.attack.malicious(1)
    for updates in seen:
        honest = [u for u in updates if u.client_id not in bad]
        malicious = [u for u in updates if u.client_id in bad]
        for u in malicious:  # the same fields, types and keys as an honest update's: only the weights differ
            assert honest and u.metrics.keys() == honest[0].metrics.keys() and type(u) is type(honest[0])
            assert u.worker == honest[0].worker and u.state == honest[0].state


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["attack=sign_flip", "attack.fraction=2"], "attack.fraction must be in [0, 1]"),
        (["attack=gaussian", "attack.std=-1"], "attack.std must be a finite number >= 0"),
    ],
)
def test_bad_attack_settings_are_refused_in_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError) as error:
        build_server(compose([*SHORT, *overrides]))
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
