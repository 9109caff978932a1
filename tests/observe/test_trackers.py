"""Experiment trackers: a real 3-round run sent to MLflow (file store) and W&B (offline), read back with each
library's own client, against fedsim's own history."""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from builders import sgd, tiny_federation, tiny_server
from cli_runner import run_cli

from fedsim.cli.run import compose
from fedsim.client.base import Client
from fedsim.core.extras import MissingExtraError
from fedsim.observe.run_logger import RunLogger
from fedsim.observe.trackers import MLflowTracker, TrackedLogger, Tracker, WandbTracker, make_logger

CONFIG = {
    "seed": 0,
    "client": {"optimizer": {"lr": 0.05}},
    "strategy": {"_target_": "fedsim.strategy.FedAvg"},
    "resume_allow_changes": [],
    "note": "x" * 7000,
}


def _run(logger: RunLogger) -> list[dict[str, Any]]:
    """A 3-round FedAvg run as ``fedsim.cli.run`` drives it (config, rounds, summary); fedsim's own history."""
    server = tiny_server(
        tiny_federation(8, num_features=10, num_classes=5, min_size=30, size_sigma_log=0.5),
        client=functools.partial(Client, epochs=1, batch_size=10, optimizer=sgd(0.05)),
        logger=logger,
    )
    logger.log_config("seed: 0")
    result = server.run()
    logger.log_hparams({}, _summary(result.history))
    return result.history


def _summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "rounds": len(history),
        "final_accuracy": history[-1]["eval/accuracy"],
        "final_loss": None,
        "finished": True,
        "stop_reason": "completed",
    }


def test_mlflow_file_store_holds_config_rounds_and_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")  # the tracker sets it for its file store
    logger = TrackedLogger(
        tmp_path, trackers=[MLflowTracker()], config=CONFIG, summary_follows=True, tensorboard=False, progress=False
    )
    history = _run(logger)

    from mlflow.tracking import MlflowClient

    client = MlflowClient((tmp_path / "mlruns").as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("fedsim").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "/".join(tmp_path.parts[-2:])
    accuracy = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval/accuracy")]
    assert sorted(accuracy) == [(r["round"], r["eval/accuracy"]) for r in history]
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted(m.step for m in losses) == [1, 2, 3]
    params = run.data.params
    assert params["client.optimizer.lr"] == "0.05" and params["strategy._target_"] == "fedsim.strategy.FedAvg"
    assert len(params["note"]) == 6000 and params["note"].endswith("...") and "resume_allow_changes" not in params
    assert run.data.metrics["final_accuracy"] == history[-1]["eval/accuracy"] and run.data.metrics["rounds"] == 3
    assert run.data.tags["stop_reason"] == "completed" and run.data.tags["final_loss"] == "None"


def _inspect(path: Path, *args: str) -> str:
    """W&B's own reader of a run's transaction log (``wandb leet inspect --json``)."""
    done = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", *args, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_wandb_offline_run_holds_config_rounds_and_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_DIR", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    start = time.perf_counter()
    history = _run(
        TrackedLogger(
            tmp_path,
            trackers=[WandbTracker(project="fedsim-test")],
            config=CONFIG,
            summary_follows=True,
            tensorboard=False,
            progress=False,
        )
    )
    assert time.perf_counter() - start < 30  # no network waits

    [log_file] = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    run = json.loads(_inspect(log_file, "--summary"))
    assert run["project"] == "fedsim-test" and run["name"] == "/".join(tmp_path.parts[-2:])
    assert run["state"] == "finished" and run["exit_code"] == 0
    assert {k: v for k, v in run["config"].items() if k != "_wandb"} == CONFIG
    assert (
        run["summary"]["final_accuracy"] == history[-1]["eval/accuracy"]
        and run["summary"]["stop_reason"] == "completed"
    )
    records = [json.loads(line) for line in _inspect(log_file).splitlines()]
    rows = [r["history"] for r in records if r["type"] == "history"]
    accuracy = [(int(row["step"]["num"]), row["item"]["eval/accuracy"]) for row in rows]
    assert accuracy == [(r["round"], r["eval/accuracy"]) for r in history]


class _Recorder(Tracker):
    def __init__(self, fail_on_round: int | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail_on_round = fail_on_round

    def start(self, run_name: str, config: dict[str, Any], run_dir: Path | None = None) -> None:
        self.calls.append(("start", run_name, config))

    def log_round(self, round_num: int, scalars: dict[str, float]) -> None:
        if round_num == self.fail_on_round:
            raise ConnectionError("tracking server went away")
        self.calls.append(("round", round_num, scalars))

    def finish(self, summary: dict[str, Any], ok: bool) -> None:
        self.calls.append(("finish", summary, ok))


def test_trackers_get_finite_scalars_only_and_a_failing_one_never_stops_the_run(tmp_path: Path) -> None:
    good, bad = _Recorder(), _Recorder(fail_on_round=2)
    logger = TrackedLogger(None, trackers=[bad, good], config={"seed": 0}, progress=False)
    logger.log_round(1, {"eval/accuracy": 0.5, "eval/loss": math.nan, "time/round_s": math.inf})
    logger.log_round(2, {"eval/accuracy": 0.6})
    logger.close()  # no summary follows: the trackers end here
    assert good.calls == [
        ("start", "fedsim", {"seed": 0}),
        ("round", 1, {"eval/accuracy": 0.5}),
        ("round", 2, {"eval/accuracy": 0.6}),
        ("finish", {}, True),
    ]
    assert logger.trackers == [good] and len(bad.calls) == 2  # dropped after its failure
    assert logger.history[0]["eval/loss"] is None  # fedsim's own record keeps every round's values


def test_tracker_options_compose_and_a_missing_library_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    assert type(make_logger(compose([]), None, tensorboard=False)) is RunLogger
    logger = make_logger(compose(["tracker=mlflow", "tracker.experiment=e"]), None, tensorboard=False)
    assert isinstance(logger, TrackedLogger) and logger.trackers[0].experiment == "e"
    wandb = make_logger(compose(["tracker=wandb", "+tracker.settings.console=off"]), None, tensorboard=False)
    assert wandb.trackers[0].mode == "offline" and wandb.trackers[0].settings == {"console": "off"}
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
    with pytest.raises(MissingExtraError, match=r"pip install 'fedsim-torch\[wandb\]'"):
        make_logger(compose(["tracker=wandb"]), None, tensorboard=False)


# what MLflow and W&B read from (or MLflowTracker sets in) the environment: each call of _refused keeps its own
TRACKER_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE", "WANDB_MODE", "WANDB_DIR", "WANDB_SILENT")


def _closed_port() -> int:
    """A port of this machine's loopback that nothing listens on (bound, then released, by this test)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _refused(tmp_path: Path, *overrides: str) -> str:
    """``fedsim`` with ``overrides`` (tests/cli_runner.py: in this process; the environment variables a tracker
    reads or sets are put back after it), which must end on its own within a minute (a tracker that cannot be
    reached used to retry for about 4 minutes): exit status 2 and one line, which is returned."""
    run_dir = tmp_path / "run"
    start = time.monotonic()
    done = run_cli(
        [*overrides, "num_rounds=2", "logger.progress=false", f"hydra.run.dir={run_dir}"],
        env={name: os.environ.get(name) for name in TRACKER_ENV},
    )
    assert time.monotonic() - start < 60, "the refusal took over a minute"
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "mlruns").exists()
    return lines[0]


@pytest.mark.slow
def test_an_unreachable_mlflow_server_stops_the_run_in_one_line_before_training(tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{_closed_port()}"
    line = _refused(tmp_path, "tracker=mlflow", f"tracker.tracking_uri={uri}")
    assert f"no MLflow server answers at tracker.tracking_uri={uri}" in line and "tracker=none" in line


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["tracker=mlflow", "tracker.tracking_uri=bogus://x"], "cannot start a run at tracker.tracking_uri=bogus://x"),
        (["tracker=wandb", "tracker.mode=bogus"], "cannot start a run (mode='bogus')"),
    ],
)
def test_a_tracker_that_cannot_start_is_one_line(tmp_path: Path, overrides: list[str], expected: str) -> None:
    assert expected in _refused(tmp_path, *overrides)
