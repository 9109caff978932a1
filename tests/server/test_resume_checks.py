"""A resume continues the same computation: changed settings are refused unless allowed (and then recorded),
a strategy state that does not fit is one line, and resuming a finished run changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli

from fedsim.cli.run import compose, run_config
from fedsim.core.checkpoint import CheckpointError, load_latest, save_checkpoint

BASE = ["num_rounds=3", "clients_per_round=4", "logger.progress=false", "logger.tensorboard=false", "+data.max_size=60"]


@pytest.fixture()
def finished(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_config(compose(BASE), run_dir=run_dir)
    return run_dir


def test_a_changed_learning_rate_is_refused_naming_it(finished: Path) -> None:
    with pytest.raises(CheckpointError) as caught:
        run_config(compose([*BASE, "num_rounds=5", "resume=true", "client.optimizer.lr=0.03"]), run_dir=finished)
    line = str(caught.value)
    assert "client.optimizer.lr (0.01 -> 0.03)" in line and "resume_allow_changes=[client.optimizer.lr]" in line
    assert "\n" not in line and not (finished / "resume_changes.jsonl").exists()


def test_an_allowed_change_runs_and_is_recorded(finished: Path, tmp_path: Path) -> None:
    changed = ["client.optimizer.lr=0.03", "resume_allow_changes=[client.optimizer.lr]"]
    resumed = run_config(compose([*BASE, "num_rounds=5", "resume=true", *changed]), run_dir=finished)
    assert len(resumed.history) == 5
    [line] = (finished / "resume_changes.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["changes"] == {"client.optimizer.lr": [0.01, 0.03]} and record["resumed_after_round"] == 3
    plain = run_config(compose([*BASE, "num_rounds=5"]), run_dir=tmp_path / "plain")
    assert not torch.equal(resumed.params, plain.params), "the new learning rate must be in effect"


def test_the_executor_and_num_rounds_may_change_freely(finished: Path, tmp_path: Path) -> None:
    resumed = run_config(
        compose(
            [*BASE, "num_rounds=5", "resume=true", "executor=process", "executor.devices=cpu", "executor.workers=2"]
        ),
        run_dir=finished,
    )
    straight = run_config(compose([*BASE, "num_rounds=5"]), run_dir=tmp_path / "straight")
    assert torch.equal(resumed.params, straight.params)
    assert not (finished / "resume_changes.jsonl").exists()


def test_another_strategy_is_refused_and_a_state_that_does_not_fit_is_one_line(finished: Path) -> None:
    with pytest.raises(
        CheckpointError, match=r"strategy._target_ \('fedsim.strategy.FedAvg' -> 'fedsim.strategy.FedAdam'\)"
    ):
        run_config(compose([*BASE, "num_rounds=5", "resume=true", "strategy=fedadam"]), run_dir=finished)
    allow = (
        "resume_allow_changes=[strategy._target_,strategy.server_lr,strategy.momentum,strategy.beta2,strategy.tau,"
        "strategy.bias_correction]"
    )
    with pytest.raises(
        CheckpointError, match=r"its strategy state does not fit FedOpt \(KeyError: 'step'\); resume with the strategy"
    ):
        run_config(compose([*BASE, "num_rounds=5", "resume=true", "strategy=fedadam", allow]), run_dir=finished)


def test_resuming_a_finished_run_says_so_and_changes_nothing(finished: Path) -> None:
    before = {p.name: p.read_bytes() for p in (finished / "summary.json", finished / "metrics.jsonl")}
    checkpoints = sorted(p.name for p in (finished / "checkpoints").glob("*.ckpt"))
    done = run_cli([*BASE, "resume=true", f"hydra.run.dir={finished}"])
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("fedsim: nothing to do: the run in ")
    assert "finished all 3 rounds; to train longer, resume with a larger num_rounds" in done.stderr
    assert {p.name: p.read_bytes() for p in (finished / "summary.json", finished / "metrics.jsonl")} == before
    assert sorted(p.name for p in (finished / "checkpoints").glob("*.ckpt")) == checkpoints


def test_a_refused_resume_from_the_command_line_is_one_line_and_exit_2(finished: Path) -> None:
    done = run_cli([*BASE, "resume=true", "client.epochs=2", f"hydra.run.dir={finished}"])
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert (
        len(lines) == 1 and lines[0].startswith("fedsim: error: resume from ") and "client.epochs (1 -> 2)" in lines[0]
    )


def test_a_checkpoint_from_before_compression_resumes_and_still_refuses_a_codec(finished: Path, tmp_path: Path) -> None:
    """Checkpoints written before fedsim had compression settings (nor byte totals) were computed in float32: they
    resume as that, and a codec is still a change."""
    path, state = load_latest(finished / "checkpoints")
    state["settings"] = {k: v for k, v in state["settings"].items() if not k.startswith("compression.")}
    del state["comm"]
    for old in (finished / "checkpoints").glob("*.pt"):
        old.unlink()
    save_checkpoint(finished / "checkpoints", state["round"], state, keep=3)
    with pytest.raises(CheckpointError, match=r"compression.uplink \(\[\] -> \['fp16'\]\)"):
        run_config(compose([*BASE, "num_rounds=4", "resume=true", "compression=fp16"]), run_dir=finished)
    result = run_config(compose([*BASE, "num_rounds=4", "resume=true"]), run_dir=finished)
    assert len(result.history) == 4 and result.history[-1]["comm/bytes_up_total"] == result.history[-1]["comm/bytes_up"]
