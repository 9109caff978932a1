"""executor=auto: its cost model by hand, its choice under a small and a large client cost, its results bitwise those
of the executor it chose, and the one line that says which and why.

The choices are made deterministic by what AutoExecutor documents as replacing its measurements: ``free_cores``
(the reading of /proc/stat), ``startup_s`` (the workers' estimated start-up) and ``client_cost_s`` (the first
round's clients). The large cost is real: a client that sleeps 0.4 s a task (tests/executor/fault_clients.py).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
import torch

from fedsim.executor import AutoExecutor
from fedsim.executor.auto_costs import PRELOAD_CPU_S, TASK_OVERHEAD_S, Cores, FirstRound, decide, startup_estimate
from fedsim.executor.cpu_load import usable_cores

sys.path.insert(0, str(Path(__file__).parent))  # tests/executor: fault_clients, executor_runs
sys.path.insert(0, str(Path(__file__).parents[1]))  # tests: cli_runner
import fault_clients  # noqa: E402  (workers import it by the same name)
from cli_runner import run_cli  # noqa: E402
from executor_runs import PER_ROUND, ROUNDS, run, serial_reference  # noqa: E402


def test_cores_share_beside_other_load() -> None:
    # 2 usable cores. Others at 0.1: one process of ours fits (1 + 0.1 <= 2), two share 2 * 2 / 2.1.
    assert Cores(2, 0.1).share(1) == 1.0
    assert Cores(2, 0.1).share(2) == pytest.approx(4 / 2.1)
    # one busy core elsewhere: serial still gets a core, two workers 2 * 2 / 3 = 1.33
    assert Cores(2, 1.0).share(1) == 1.0 and Cores(2, 1.0).share(2) == pytest.approx(4 / 3)
    # an oversubscribed machine (others 1.7): serial 2 / 2.7, two workers 4 / 3.7
    assert Cores(2, 1.7).share(1) == pytest.approx(2 / 2.7) and Cores(2, 1.7).share(2) == pytest.approx(4 / 3.7)
    assert Cores(2, None).share(2) == 2.0 and "unknown" in Cores(2, None).describe()
    assert Cores(2, 0.1).describe() == "1.9 of 2 cores free"


def test_large_client_cost_chooses_process() -> None:
    # clients 0.8 s of a 1.1 s round, 10 tasks, 2 workers, 1.9 cores free, 29 rounds left, 1.2 s start-up:
    # speedup 4/2.1 = 1.905; a round saves 0.8 - (0.8 / 1.905 + 10 * 0.001) = 0.37 s, 29 of them 10.73 s;
    # less the start-up 9.53 s, more than max(1 s, 10 % of 29 * 1.1 s = 3.19 s): process
    decision = decide(FirstRound(0.8, 1.1, 10), Cores(2, 0.1), 2, 29, 1.2)
    assert TASK_OVERHEAD_S == 0.001
    assert decision.executor == "process"
    assert decision.reason == (
        "process (2 workers): clients cost 0.80 s of a 1.10 s round, 1.9 of 2 cores free, 29 rounds left; "
        "estimated: 2 workers save ~10.7 s for ~1.2 s of start-up"
    )
    # one core busy elsewhere: speedup 1.333, a round saves 0.8 - 0.6 - 0.01 = 0.19 s, 29 of them 5.51 s, less
    # 1.2 s: 4.31 s > 3.19 s, still process
    assert decide(FirstRound(0.8, 1.1, 10), Cores(2, 1.0), 2, 29, 1.2).executor == "process"
    # ... but not for 3 rounds: 3 * 0.19 - 1.2 < 0
    assert decide(FirstRound(0.8, 1.1, 10), Cores(2, 1.0), 2, 3, 1.2).executor == "serial"


def test_small_client_cost_chooses_serial() -> None:
    # the default logreg: clients 0.05 s of a 0.13 s round; a round saves 0.05 - (0.05 / 1.905 + 0.01) = 0.0138 s,
    # 29 of them 0.40 s, less 0.5 s of start-up: below the 1 s margin
    decision = decide(FirstRound(0.05, 0.13, 10), Cores(2, 0.1), 2, 29, 0.5)
    assert decision.executor == "serial"
    assert decision.reason.startswith("serial: clients cost 0.05 s of a 0.13 s round, 1.9 of 2 cores free")
    # one core: no process to choose
    assert decide(FirstRound(0.8, 1.1, 10), Cores(1, 0.0), 1, 29, 0.0).executor == "serial"


def test_vmap_is_chosen_only_when_tried_and_faster_by_the_margin() -> None:
    first, cores = FirstRound(0.8, 1.1, 10), Cores(2, 0.1)
    # serial 29 * 1.1 = 31.9 s; process 31.9 - 10.73 + 1.2 = 22.37 s; vmap 31.9 - 29 * (0.8 - 0.1) = 11.6 s
    assert decide(first, cores, 2, 29, 1.2, vmap_clients_s=0.1).executor == "vmap"
    # vmap at 0.5 s: 31.9 - 8.7 = 23.2 s, slower than process
    assert decide(first, cores, 2, 29, 1.2, vmap_clients_s=0.5).executor == "process"


def test_startup_estimate() -> None:
    # a forkserver never started: its imports on one free core, then 2 builds of 0.1 s (+ 0.05 s each) on 2 cores
    assert startup_estimate(Cores(2, 0.0), 2, 0.1, None) == pytest.approx(PRELOAD_CPU_S + 2 * 0.15 / 2)
    # started 10 s ago: its imports are done
    assert startup_estimate(Cores(2, 0.0), 2, 0.1, 10.0) == pytest.approx(0.15)


def test_small_cost_stays_serial_bitwise(caplog: pytest.LogCaptureFixture) -> None:
    executor = AutoExecutor(rounds=ROUNDS, workers=2, free_cores=2.0, client_cost_s=0.01, startup_s=0.0)
    with caplog.at_level(logging.INFO, logger="fedsim"):
        result = run(executor)
    assert executor.decision is not None and executor.decision.executor == "serial"
    assert torch.equal(result.params, serial_reference())
    assert {c["worker"] for r in result.history for c in r["clients"]} == {"serial"}
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("executor=auto")]
    assert line.startswith("executor=auto: serial: clients cost 0.01 s of a ")
    assert f"2.0 of {usable_cores():g} cores free, {ROUNDS - 1} rounds left" in line


@pytest.mark.slow
def test_large_cost_switches_to_process_bitwise(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """4 clients of 0.4 s a round: 1.6 s; over the 2 rounds left 2 workers save 2 * 0.8 s, above the 1 s margin."""
    executor = AutoExecutor(rounds=ROUNDS, workers=2, free_cores=2.0, startup_s=0.0)
    with caplog.at_level(logging.INFO, logger="fedsim"):
        result = run(executor, client_cls=fault_clients.SlowClient, run_dir=tmp_path, delay_s=0.4)
    assert executor.decision is not None and executor.decision.executor == "process", executor.decision
    assert torch.equal(result.params, serial_reference())
    workers = [{c["worker"] for c in r["clients"]} for r in result.history]
    assert workers[0] == {"serial"} and all(w <= {"w0", "w1"} for w in workers[1:]), workers
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("executor=auto")]
    assert line.startswith("executor=auto: process (2 workers): clients cost 1.")
    assert PER_ROUND == 4  # what the docstring's arithmetic assumes


@pytest.mark.slow
def test_cli_logs_the_choice_and_ends_as_serial(tmp_path: Path) -> None:
    common = ["num_rounds=3", "logger.progress=false", "logger.tensorboard=false"]
    auto = run_cli([*common, "executor=auto", "executor.free_cores=2", f"hydra.run.dir={tmp_path / 'auto'}"])
    serial = run_cli([*common, "executor=serial", f"hydra.run.dir={tmp_path / 'serial'}"])
    assert auto.returncode == 0 and serial.returncode == 0, auto.stderr + serial.stderr
    lines = [x for x in (tmp_path / "auto" / "run.log").read_text().splitlines() if "executor=auto:" in x]
    assert len(lines) == 1 and "executor=auto: serial: clients cost" in lines[0] and "2 rounds left" in lines[0]
    assert "executor=auto: serial" in auto.stderr + auto.stdout  # the console too
    metrics = [(tmp_path / run / "metrics.jsonl").read_text() for run in ("auto", "serial")]
    assert metrics[0].count("eval/accuracy") == 3
    assert _without_times(metrics[0]) == _without_times(metrics[1])


def _without_times(text: str) -> list[dict]:
    """metrics.jsonl's records without what measures time or memory (which differ between any two runs)."""
    records = [json.loads(line) for line in text.splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "system/"))} for r in records]


@pytest.mark.slow
def test_allow_vmap_tries_it_for_one_round_and_keeps_it_when_faster(caplog: pytest.LogCaptureFixture) -> None:
    """One worker: no process to choose. Serial's clients are said to cost 10 s a round (client_cost_s), so vmap's
    trial round, which trains the same clients in well under 9 s, saves more than the 1 s margin over the last round."""
    executor = AutoExecutor(rounds=ROUNDS, workers=1, allow_vmap=True, client_cost_s=10.0, startup_s=0.0)
    with caplog.at_level(logging.INFO, logger="fedsim"):
        result = run(executor)
    assert executor.decision is not None and executor.decision.executor == "vmap"
    workers = [{c["worker"] for c in r["clients"]} for r in result.history]
    assert workers[0] == {"serial"} and "serial" not in workers[1] | workers[2], workers
    reference = serial_reference()
    assert float((result.params - reference).norm() / reference.norm()) < 1e-5  # vmap's documented tolerance
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("executor=auto")]
    assert line.startswith("executor=auto: vmap: clients cost 10.00 s") and "vmap's clients took" in line


def test_vmap_that_cannot_run_the_clients_is_not_tried(caplog: pytest.LogCaptureFixture) -> None:
    executor = AutoExecutor(rounds=ROUNDS, workers=1, allow_vmap=True, client_cost_s=10.0, startup_s=0.0)
    with caplog.at_level(logging.INFO, logger="fedsim"):
        result = run(executor, client_cls=fault_clients.SlowClient)  # overrides fit: vmap refuses it
    assert executor.decision is not None and executor.decision.executor == "serial"
    assert torch.equal(result.params, serial_reference())
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("executor=auto")]
    assert "; vmap cannot run this workload: " in line and "SlowClient" in line


@pytest.mark.slow
@pytest.mark.parametrize("stop_after", [2, 3])
def test_a_resumed_auto_run_goes_on_with_the_executors_of_an_uninterrupted_one(tmp_path: Path, stop_after: int) -> None:
    """allow_vmap, one worker, serial's clients said to cost 10 s a round: round 1 serial, round 2 vmap's trial,
    vmap from round 3 (the decision). Stopped after round 2 (trials measured, no decision yet) or 3 (vmap chosen)
    and resumed to round 4, the run is the uninterrupted one bit for bit (vmap's results are not serial's: a resumed
    run that tried again from its own first round would train round 3 serially and differ)."""
    common = [
        "logger.progress=false",
        "logger.tensorboard=false",
        "executor=auto",
        "executor.allow_vmap=true",
        "executor.workers=1",
        "executor.client_cost_s=10",
        "executor.startup_s=0",
    ]
    whole = run_cli([*common, "num_rounds=4", f"hydra.run.dir={tmp_path / 'whole'}"])
    first = run_cli([*common, f"num_rounds={stop_after}", f"hydra.run.dir={tmp_path / 'resumed'}"])
    rest = run_cli([*common, "num_rounds=4", "resume=true", f"hydra.run.dir={tmp_path / 'resumed'}"])
    assert whole.returncode == first.returncode == rest.returncode == 0, whole.stderr + first.stderr + rest.stderr
    logs = {run: (tmp_path / run / "run.log").read_text() for run in ("whole", "resumed")}
    assert "executor=auto: vmap: " in logs["whole"]
    if stop_after == 3:
        assert "(the resumed run's checkpoint)" in logs["resumed"]
    metrics = [_without_times((tmp_path / run / "metrics.jsonl").read_text()) for run in ("whole", "resumed")]
    assert len(metrics[0]) == 4 and metrics[0] == metrics[1]
