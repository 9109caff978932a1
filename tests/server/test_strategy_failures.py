"""A strategy that fails is named, and the run stays resumable: unusable ``aggregate`` output (NaN/inf, wrong
shape or dtype, not a tensor) or an exception stops the round with one line naming the strategy before any
client is blamed; the run leaves ``summary.json`` (``finished: false``, the error) and the checkpoint of the
last completed round, from which the fixed strategy resumes to the uninterrupted result; robust rules refuse
a round that failures left too small instead of changing their rule."""

from __future__ import annotations

import functools
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))  # failing_strategies
sys.path.insert(0, str(TESTS / "executor"))  # fault_clients

import fault_clients  # noqa: E402
from builders import tiny_federation, tiny_server  # noqa: E402
from cli_runner import run_cli  # noqa: E402
from failing_strategies import BadReturnFedAvg, FlakyFedAdam, NaNFedAvg  # noqa: E402

from fedsim.cli.run import compose, run_config  # noqa: E402
from fedsim.client.base import Client  # noqa: E402
from fedsim.core.checkpoint import CheckpointError, list_checkpoints, load_checkpoint, load_latest  # noqa: E402
from fedsim.executor import SerialExecutor  # noqa: E402
from fedsim.observe.run_logger import RunLogger  # noqa: E402
from fedsim.report.runs import load_run  # noqa: E402
from fedsim.server.server import RoundFailedError, Server, StrategyError  # noqa: E402
from fedsim.server.settings import Checkpoints  # noqa: E402
from fedsim.strategy import FedAvg, Krum, Strategy, TrimmedMean  # noqa: E402


@functools.cache
def _server(
    strategy: Strategy,
    run_dir: Path | None = None,
    *,
    num_rounds: int = 3,
    clients_per_round: int = 4,
    client_cls: Any = Client,
    min_success_fraction: float = 1.0,
    checkpoint: bool = False,
    **client_kwargs: Any,
) -> Server:
    return tiny_server(
        tiny_federation(10, num_features=10, num_classes=5, max_size=40),
        client=functools.partial(client_cls, epochs=1, batch_size=10, **client_kwargs),
        strategy=strategy,
        num_rounds=num_rounds,
        clients_per_round=clients_per_round,
        min_success_fraction=min_success_fraction,
        seed=1,
        logger=RunLogger(run_dir, tensorboard=False, progress=False),
        checkpoints=Checkpoints(run_dir / "checkpoints") if checkpoint and run_dir is not None else None,
    )


def _one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text, text
    return text


# --- unusable output of aggregate -----------------------------------------------------------------------------


def test_nan_from_the_strategy_stops_the_round_naming_it_before_any_client_is_blamed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = _server(NaNFedAvg(nan_round=2, count=5), tmp_path)
    after_round_1 = _server(FedAvg(), num_rounds=1).run().params
    with caplog.at_level(logging.INFO, logger="fedsim"), pytest.raises(StrategyError) as info:
        server.run()
    assert isinstance(info.value, RoundFailedError)  # existing handlers (python -m fedsim: exit 1) catch it
    assert _one_line(info.value) == (
        "round 2: NaNFedAvg.aggregate returned 5 non-finite values (NaN or inf); the model of round 1 is kept"
    )
    assert torch.equal(server.params, after_round_1)  # the NaNs never became the global model
    assert [r["round"] for r in server.logger.history] == [1]
    assert server.logger.history[0]["client/num_rejected"] == 0.0
    assert "rejected" not in caplog.text and "failures" not in caplog.text  # no client was blamed
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1] and records[0]["client/num_rejected"] == 0.0


@pytest.mark.parametrize(
    ("how", "problem"),
    [
        ("short", r"returned shape \((\d+),\) but the global model has \(\d+,\)"),
        ("int64", r"returned dtype torch\.int64, not a floating-point dtype"),
        ("huge", r"returned \d+ non-finite values \(NaN or inf\)"),  # float64 values that overflow float32
        ("list", r"returned a list, not a tensor"),
    ],
)
def test_wrong_shape_dtype_or_type_from_the_strategy_stops_the_round_naming_it(how: str, problem: str) -> None:
    server = _server(BadReturnFedAvg(how=how, bad_round=1))
    initial = server.params.clone()
    with pytest.raises(
        StrategyError, match=rf"^round 1: BadReturnFedAvg\.aggregate {problem}; the model of round 0 is kept$"
    ) as info:
        server.run()
    _one_line(info.value)
    assert torch.equal(server.params, initial) and server.logger.history == []


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            "RuntimeError",
            "round 2: FlakyFedAdam.aggregate raised RuntimeError: moments updated, then exploded in round 2",
        ),
        ("ValueError", "round 2: FlakyFedAdam could not aggregate: moments updated, then exploded in round 2"),
    ],
)
def test_an_exception_from_aggregate_becomes_one_line_naming_the_strategy(error: str, expected: str) -> None:
    server = _server(FlakyFedAdam(fail_round=2, error=error, server_lr=0.01))
    with pytest.raises(StrategyError) as info:
        server.run()
    assert _one_line(info.value) == expected
    assert type(info.value.__cause__).__name__ == error  # the original error and its traceback stay chained


# --- the run stops resumable ------------------------------------------------------------------------------------

BASE = [
    "num_rounds=5",
    "clients_per_round=5",
    "checkpoint_every=0",
    "logger.progress=false",
    "logger.tensorboard=false",
    "+data.max_size=60",
]
FIXED = ["strategy=fedadam"]
BROKEN = [*FIXED, "strategy._target_=failing_strategies.FlakyFedAdam", "+strategy.fail_round=3"]


def test_a_strategy_raising_in_round_3_leaves_summary_and_round_2_checkpoint_and_resumes_bitwise(
    tmp_path: Path,
) -> None:
    full = run_config(compose([*BASE, *FIXED]), run_dir=tmp_path / "full")

    run_dir = tmp_path / "broken"
    with pytest.raises(StrategyError, match=r"^round 3: FlakyFedAdam\.aggregate raised RuntimeError: moments updated"):
        run_config(compose([*BASE, *BROKEN]), run_dir=run_dir)
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["round-000002.ckpt"]  # checkpoint_every=0
    state = load_checkpoint(run_dir / "checkpoints" / "round-000002.ckpt")
    assert state["round"] == 2 and state["strategy"]["step"] == 2  # round 2's state, not the half-done round 3
    assert [r["round"] for r in state["history"]] == [1, 2]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["finished"] is False and summary["rounds"] == 2
    assert summary["stop_reason"].startswith("error: round 3: FlakyFedAdam.aggregate raised RuntimeError: ")
    assert "\n" not in summary["stop_reason"]
    assert summary["final_accuracy"] == full.history[1]["eval/accuracy"]  # the rounds done so far
    assert load_run(run_dir, tmp_path).finished is False  # reports count it as unfinished

    with pytest.raises(
        CheckpointError, match=r"strategy._target_ \('failing_strategies.FlakyFedAdam' -> 'fedsim.strategy.FedAdam'\)"
    ):
        run_config(compose([*BASE, *FIXED, "resume=true"]), run_dir=run_dir)  # another class: refused unless allowed
    allow = "resume_allow_changes=[strategy._target_,strategy.fail_round]"
    resumed = run_config(compose([*BASE, *FIXED, "resume=true", allow]), run_dir=run_dir)
    assert torch.equal(resumed.params, full.params)
    [line] = (run_dir / "resume_changes.jsonl").read_text().splitlines()  # the change is on record
    assert json.loads(line)["changes"]["strategy._target_"] == [
        "failing_strategies.FlakyFedAdam",
        "fedsim.strategy.FedAdam",
    ]
    assert torch.equal(load_latest(run_dir / "checkpoints")[1]["params"], full.params)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["finished"] is True and summary["stop_reason"] == "completed" and summary["rounds"] == 5
    assert load_run(run_dir, tmp_path).finished is True


def test_a_failure_in_round_1_writes_no_checkpoint_and_a_summary_of_zero_rounds(tmp_path: Path) -> None:
    overrides = [*BASE, "strategy._target_=failing_strategies.NaNFedAvg", "+strategy.nan_round=1"]
    with pytest.raises(StrategyError, match=r"^round 1: NaNFedAvg\.aggregate returned 5 non-finite"):
        run_config(compose(overrides), run_dir=tmp_path)
    assert list_checkpoints(tmp_path / "checkpoints") == []
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["finished"] is False and summary["rounds"] == 0 and summary["final_accuracy"] is None
    assert summary["stop_reason"] == (
        "error: round 1: NaNFedAvg.aggregate returned 5 non-finite values (NaN or inf); the model of round 0 is kept"
    )


def test_an_executor_error_also_leaves_the_last_good_checkpoint(tmp_path: Path) -> None:
    class BrokenExecutor(SerialExecutor):
        def fit(self, params, tasks):  # type: ignore[no-untyped-def]
            if tasks[0].round_num == 3:
                raise OSError("lost the worker pool")
            return super().fit(params, tasks)

    server = _server(FlakyFedAdam(server_lr=0.01), tmp_path, num_rounds=4, checkpoint=True)
    server.parts.executor = BrokenExecutor()
    with pytest.raises(OSError, match="lost the worker pool"):
        server.run()
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == ["round-000002.ckpt"]


def test_without_checkpoints_an_error_writes_none(tmp_path: Path) -> None:
    with pytest.raises(StrategyError):
        _server(NaNFedAvg(nan_round=2), tmp_path).run()
    assert not (tmp_path / "checkpoints").exists()


def test_the_command_line_prints_one_line_exits_1_and_writes_the_summary(tmp_path: Path) -> None:
    done = run_cli(
        [*BASE, "strategy._target_=failing_strategies.NaNFedAvg", "+strategy.nan_round=2", f"hydra.run.dir={tmp_path}"],
        pythonpath=[TESTS],
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == (
        "fedsim: error: round 2: NaNFedAvg.aggregate returned 5 non-finite values (NaN or inf); "
        "the model of round 1 is kept"
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (
        summary["finished"] is False
        and summary["rounds"] == 1
        and summary["stop_reason"].startswith("error: round 2: ")
    )
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == ["round-000001.ckpt"]


# --- robust rules refuse a round that failures left too small ---------------------------------------------------


def test_trimmed_mean_refuses_a_round_that_a_failed_client_left_without_trimming() -> None:
    # 10 clients per round: beta=0.1 trims floor(1.0) = 1 at each end; one failure leaves 9, floor(0.9) = 0
    server = _server(
        TrimmedMean(beta=0.1),
        clients_per_round=10,
        client_cls=fault_clients.RaisingClient,
        min_success_fraction=0.5,
        bad_ids=(3,),
    )
    with pytest.raises(StrategyError) as info:
        server.run()
    assert _one_line(info.value) == (
        "round 1: TrimmedMean could not aggregate: strategy=trimmed_mean with beta=0.1 trims floor(beta*9) = 0 of 9 "
        "updates left in the round; raise strategy.beta or min_success_fraction, or set strategy.beta=0 for the mean"
    )
    assert server.logger.history == []


def test_trimmed_mean_with_every_client_still_trims() -> None:
    result = _server(
        TrimmedMean(beta=0.1),
        clients_per_round=10,
        num_rounds=1,
        client_cls=fault_clients.RaisingClient,
        min_success_fraction=0.5,
    ).run()
    assert result.history[0]["client/num_aggregated"] == 10.0


def test_krum_refuses_a_round_that_failed_clients_left_too_small() -> None:
    # f=3 needs 2f+3 = 9 updates: all 10 clients are sampled, two fail, 8 are left
    server = _server(
        Krum(f=3),
        clients_per_round=10,
        client_cls=fault_clients.RaisingClient,
        min_success_fraction=0.5,
        bad_ids=(3, 7),
    )
    with pytest.raises(StrategyError) as info:
        server.run()
    assert _one_line(info.value) == (
        "round 1: Krum could not aggregate: strategy=krum needs at least 2f+3 = 9 clients "
        "per round (f=3) but the round has 8; lower strategy.f or raise clients_per_round"
    )


def test_a_float64_result_is_cast_back_and_the_run_goes_on() -> None:
    cast = _server(BadReturnFedAvg(how="float64", bad_round=1)).run()
    plain = _server(FedAvg()).run()
    assert cast.params.dtype == torch.float32
    assert torch.equal(cast.params, plain.params)  # FedAvg's float32 result, through float64 and back
