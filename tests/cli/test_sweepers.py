"""fedsim under the Hydra sweepers and launchers researchers use: a job that fails leaves the others running,
``python -m fedsim`` returns its objective to Optuna, and the submitit launcher runs jobs (its local executor).
Every sweep is a real command line in this process (tests/cli_runner.py); submitit's launcher starts each of its
jobs in a fresh process of its own (submitit's local executor), which is what its test looks at."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from cli_runner import run_cli

from fedsim.cli.objective import objective_value
from fedsim.report import command as report

FAST = ["num_rounds=2", "data.num_devices=10", "clients_per_round=3", "logger=quiet"]


def _args(sweep_dir: Path, *overrides: str) -> list[str]:
    return ["-m", *FAST, *overrides, f"hydra.sweep.dir={sweep_dir}"]


def _sweep(sweep_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return run_cli(_args(sweep_dir, *overrides))


def _summaries(sweep_dir: Path) -> dict[str, dict]:
    return {p.parent.name.split("_", 1)[0]: json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/summary.json"))}


def test_objective_reduces_a_metric_over_the_rounds() -> None:
    history = [
        {"eval/accuracy": 0.5, "eval/loss": 2.0},
        {"eval/accuracy": None},
        {"eval/accuracy": 0.7, "eval/loss": 1.0},
        {"eval/accuracy": 0.6, "eval/loss": 1.5},
    ]
    assert objective_value(history, "eval/accuracy", "final") == 0.6
    assert objective_value(history, "eval/accuracy", "max") == 0.7
    assert objective_value(history, "eval/loss", "min") == 1.0
    assert math.isnan(objective_value(history, "fit/nothing", "final"))


def test_a_failing_job_is_recorded_and_the_others_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    done = _sweep(tmp_path, "client.optimizer.lr=0.05,-1,0.1")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "fedsim: error: client.optimizer.lr must be > 0 (got -1); e.g. client.optimizer.lr=0.01 (a job of the sweep; "
        "the others ran: python -m fedsim.report <sweep dir> lists them)"
    )
    assert "Traceback" not in done.stderr
    summaries = _summaries(tmp_path)
    assert [summaries[job]["finished"] for job in ("0", "1", "2")] == [True, False, True]
    assert (
        summaries["1"]["stop_reason"]
        == "error: client.optimizer.lr must be > 0 (got -1); e.g. client.optimizer.lr=0.01"
    )
    capsys.readouterr()
    assert report.main([str(tmp_path)]) == 0
    assert "client.optimizer.lr must be > 0 (got -1)" in capsys.readouterr().out


def test_optuna_sweeper_gets_the_objective_of_every_trial(tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="the test extra installs hydra-optuna-sweeper")
    done = _sweep(
        tmp_path,
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=4",
        "hydra.sweeper.direction=maximize",
        "hydra.sweeper.sampler.seed=0",
        "client.optimizer.lr=interval(0.01,0.3)",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    finals = [s["final_accuracy"] for s in _summaries(tmp_path).values()]
    assert len(finals) == 4 and all(s is not None for s in finals)
    results = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert results["best_value"] == max(finals)


@pytest.mark.slow
def test_submitit_local_launcher_runs_each_job_in_its_own_process(tmp_path: Path) -> None:
    pytest.importorskip(
        "hydra_plugins.hydra_submitit_launcher", reason="the test extra installs hydra-submitit-launcher"
    )
    done = _sweep(tmp_path, "hydra/launcher=submitit_local", "client.optimizer.lr=0.05,0.1", "resume=auto")
    assert done.returncode == 0, done.stderr[-2000:]
    summaries = _summaries(tmp_path)
    assert sorted(summaries) == ["0", "1"] and all(s["finished"] and s["rounds"] == 2 for s in summaries.values())
    results = list(tmp_path.glob(".submitit/*/*_result.pkl"))
    assert len(results) == 2, "submitit ran both jobs"
    # a local job's folder is named by its job id, the pid of the process submitit started for it
    assert len({p.parent.name for p in results}) == 2 and str(os.getpid()) not in {p.parent.name for p in results}
