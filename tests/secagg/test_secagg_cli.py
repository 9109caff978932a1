"""Secure aggregation from the command line (conf/secagg/, fedsim/cli/secagg_option.py): what it cannot run with
is one line before any work (Krum by the round's declarations, central DP, uplink codecs, an asynchronous strategy,
a bad key, distributed DP's bad settings, a target ε no noise reaches, a budget one round exceeds); a SecAgg+ run with
dropouts recovers and its comm/ totals add up; a round with too few survivors stops the run in one line with the
last good round's checkpoint; distributed DP's budget stops a run before it is exceeded; a run with SecAgg+ and
distributed DP killed with kill -9 resumes exactly (Skellam on the simulated clock, with the process executor), and
one with the discrete Gaussian resumes exactly from a checkpoint."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_runner import run_cli
from own_processes import live_tagged, new_tag, tagged_environment

from fedsim.core.checkpoint import load_latest
from fedsim.secagg import DistributedDP, SecureAggregation
from fedsim.secagg.accounting import rdp_epsilon

FAST = ["data.num_devices=12", "clients_per_round=4", "logger.progress=false"]


def _cli(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return run_cli([*FAST, *overrides, f"hydra.run.dir={run_dir}"])


def _history(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


KRUM = (
    "fedsim: error: round: stage 'aggregate' (the strategy fedsim.strategy.robust.Krum) needs the individual client "
    "updates, which stage 'secagg' (secagg=secagg: only the sum reaches the server) before it does not pass on; use a "
    "strategy of the mean update (fedavg, fedprox, fedavgm, fedadam, fedyogi, fedadagrad), or declare needs = "
    "frozenset() on yours if it aggregates their mean alone (docs/writing-a-round-step.md)"
)


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["strategy=krum", "clients_per_round=6"], KRUM),
        (["dp=central"], "fedsim: error: secagg=secagg: dp=central noises the individual updates, which secure"),
        (["compression=fp16"], "fedsim: error: secagg=secagg: the clients upload masked integers, not the uplink"),
        (["strategy=fedbuff", "clock=sampled"], "fedsim: error: secagg=secagg: FedBuff is asynchronous"),
        (["secagg.bits=4"], "fedsim: error: secagg.bits must be in [8, 32] (got 4)"),
        (["secagg.clip=0"], "fedsim: error: secagg.clip must be a finite number > 0 (got 0)"),
        (["secagg.bits=sixteen"], "fedsim: error: secagg.bits"),
        (["secagg.dropuot=0.1"], "fedsim: error: unknown setting secagg.dropuot; did you mean secagg.dropout?"),
        (["secagg.dp.mechanism=gauss"], "fedsim: error: secagg.dp.mechanism must be one of none, ddg, skellam"),
        (["secagg.dp.mechanism=ddg"], "fedsim: error: secagg.dp.mechanism=ddg needs exactly one of"),
        (["secagg.dp.mechanism=ddg", "secagg.dp.noise_multiplier=one"], "fedsim: error: secagg.dp.noise_multiplier"),
        (
            ["secagg.dp.mechanism=skellam", "secagg.dp.noise_multiplier=1", "secagg.dp.delta=0.1"],
            "fedsim: error: secagg.dp.delta=0.1 must be below 1/12",
        ),
        (
            ["secagg.dp.mechanism=ddg", "secagg.dp.noise_multiplier=1", "secagg.dp.epsilon_max=0.01"],
            "fedsim: error: secagg.dp.epsilon_max=0.01 is below ε=",
        ),
        (
            ["secagg.dp.mechanism=ddg", "secagg.dp.epsilon=0.001", "secagg.bits=8"],
            "fedsim: error: secagg.dp.epsilon=0.001 cannot be reached in 30 rounds of 4 clients",
        ),
    ],
)
def test_what_secure_aggregation_cannot_run_with_is_one_line(tmp_path: Path, overrides: list[str], line: str) -> None:
    done = _cli(tmp_path, "secagg=secagg", *overrides)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), done.stderr
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_secagg_plus_run_with_dropouts_recovers_and_its_comm_totals_add_up(tmp_path: Path) -> None:
    done = _cli(
        tmp_path,
        "secagg=secagg_plus",
        "secagg.degree=4",
        "secagg.dropout=0.15",
        "secagg.threshold=0.4",
        "data.num_devices=16",
        "clients_per_round=8",
        "num_rounds=6",
    )
    assert done.returncode == 0, done.stderr
    rows = _history(tmp_path)
    assert all(r["secagg/cohort"] == 8 and r["secagg/degree"] == 4 and r["secagg/wrapped"] == 0 for r in rows)
    assert sum(r["secagg/dropped"] for r in rows) > 0  # some clients dropped out and the rounds recovered
    assert all(r["comm/bytes_up"] == r["secagg/bytes_up"] for r in rows)
    assert rows[-1]["comm/bytes_up_total"] == sum(r["comm/bytes_up"] for r in rows)
    assert rows[-1]["comm/bytes_down_total"] == sum(r["comm/bytes_down"] for r in rows)


@pytest.mark.slow
def test_too_few_survivors_stop_the_run_in_one_line_with_the_last_good_checkpoint(tmp_path: Path) -> None:
    """All 12 clients take part every round (seed 2) and each must survive (threshold 1): the run fails in the first
    round in which one of them draws a dropout, which the stage's own draws say is round 3."""
    stage = SecureAggregation(seed=2, dropout=0.03)
    failing = next(r for r in range(1, 10) if any(stage.drops(r, c) for c in range(12)))
    assert failing > 1  # the run has a good round to fall back to
    done = _cli(
        tmp_path,
        "seed=2",
        "secagg=secagg",
        "secagg.threshold=1.0",
        "secagg.dropout=0.03",
        "clients_per_round=12",
        "checkpoint_every=1",
        "num_rounds=8",
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"fedsim: error: round {failing}: secure aggregation (secagg) failed: 11 of 12 clients survived, and client"
    ), done.stderr
    assert load_latest(tmp_path / "checkpoints")[0].name == f"round-{failing - 1:06d}.ckpt"
    assert len(_history(tmp_path)) == failing - 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["finished"] is False
    assert summary["stop_reason"] == f"error: {lines[0].removeprefix('fedsim: error: ')}"


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["ddg", "skellam"])
def test_the_budget_stops_a_distributed_dp_run_before_the_round_that_would_exceed_it(
    tmp_path: Path, mechanism: str
) -> None:
    """z = 1 with 4 clients a round: ε of r rounds is the stage's own ledger; the budget sits between rounds 3 and
    4, so the run ends after round 3 with a checkpoint and the stop reason, never above the budget."""
    stage = SecureAggregation(seed=0, clients_per_round=4, dp=DistributedDP(mechanism=mechanism, noise_multiplier=1.0))
    stage.prepare(610)  # the default task's logistic regression: 60 features, 10 classes
    noise = stage.dp.noise(1.0, stage.quantizer(1, 4, 610).levels, 1024, 4)  # the stage's default scale
    eps = [rdp_epsilon(r * noise.rdp(4), 1e-5) for r in (3, 4)]
    budget = round((eps[0] + eps[1]) / 2, 4)
    done = _cli(
        tmp_path,
        "secagg=secagg",
        f"secagg.dp.mechanism={mechanism}",
        "secagg.dp.noise_multiplier=1",
        f"secagg.dp.epsilon_max={budget}",
        "num_rounds=10",
    )
    assert done.returncode == 0, done.stderr
    rows = _history(tmp_path)
    assert len(rows) == 3 and rows[-1]["secagg/dp/epsilon"] == pytest.approx(eps[0], rel=1e-12)
    assert rows[-1]["secagg/dp/epsilon"] <= budget
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stop_reason"].startswith(
        f"privacy budget: round 4 would bring ε to {eps[1]:.4g} > secagg.dp.epsilon_max={budget}"
    )
    assert load_latest(tmp_path / "checkpoints")[0].name == "round-000003.ckpt"


@pytest.fixture
def own() -> Iterator[str]:
    """The tag of the test's subprocess; after the test, no process of its tree is alive. The killed run's
    forkserver, workers and resource tracker go in a chain (each on the previous one's end), which a loaded machine
    may take seconds to schedule: a process still there after 10 s outlived the run."""
    tag = new_tag()
    yield tag
    deadline = time.monotonic() + 10
    while live_tagged(tag):
        assert time.monotonic() < deadline, f"processes of the killed run still alive: {live_tagged(tag)}"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_run_with_secure_aggregation_and_distributed_dp_resumes_exactly_after_kill_9(
    tmp_path: Path, own: str
) -> None:
    """The run killed after round 4 or later and resumed from its last checkpoint ends with the weights, the stage's
    checkpoint entry and every secagg/, comm/ and sim/ metric of the run never killed: Skellam noise with SecAgg+'s
    dropouts on the simulated clock, the clients trained in worker processes (which die with the killed run).

    One mechanism stands for both: what a resume restores of distributed DP (its ledger: the summed Rényi curve,
    the rounds, z) is one class's state for either, and either's noise is drawn afresh from the stream of (seed,
    round, client), nothing carried between rounds (tests/secagg/test_secagg_ddp.py checks those bits and the
    discrete Gaussian's ε per round)."""
    setting = [
        "secagg.dp.mechanism=skellam",
        "clock=sampled",
        "executor=process",
        "executor.devices=cpu",
        "executor.workers=2",
    ]
    rounds = [
        "num_rounds=12",
        "checkpoint_every=1",
        "secagg=secagg_plus",
        "secagg.degree=4",
        "secagg.dropout=0.1",
        "secagg.threshold=0.4",
        "secagg.bits=16",
        "secagg.dp.noise_multiplier=0.5",
        "data.num_devices=16",
        "clients_per_round=8",
        *setting,
    ]
    whole = _cli(tmp_path / "whole", *rounds)
    assert whole.returncode == 0, whole.stderr
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedsim", *FAST, *rounds, f"hydra.run.dir={run_dir}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=tagged_environment(own),
    )
    deadline = time.monotonic() + 180
    while not (run_dir / "metrics.jsonl").exists() or len(_history(run_dir)) < 4:
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert len(_history(run_dir)) < 12, "killed before the end"
    resumed = _cli(run_dir, *rounds, "resume=true")
    assert resumed.returncode == 0, resumed.stderr
    final = load_latest(run_dir / "checkpoints")[1]
    assert torch.equal(final["params"], load_latest(tmp_path / "whole" / "checkpoints")[1]["params"])
    assert final["stage/secagg"] == load_latest(tmp_path / "whole" / "checkpoints")[1]["stage/secagg"]
    keys = [k for k in _history(run_dir)[0] if k.startswith(("secagg/", "comm/", "sim/"))]
    assert {"secagg/dp/epsilon", "secagg/time/round_s", "sim/time_s"} <= set(keys)
    resumed_rows, whole_rows = ([[r[k] for k in keys] for r in _history(d)] for d in (run_dir, tmp_path / "whole"))
    assert resumed_rows == whole_rows and len(whole_rows) == 12
    assert sum(r["secagg/dropped"] for r in _history(run_dir)) > 0  # the recoveries were resumed too


@pytest.mark.slow
def test_a_run_with_the_discrete_gaussian_resumes_exactly_from_a_checkpoint(tmp_path: Path) -> None:
    """The discrete Gaussian's side of the kill -9 test above, in this process: a run resumed from its round-3
    checkpoint (into a directory of its own) ends with the weights, the stage's checkpoint entry (its ledger) and
    the secagg/ metrics of the run that was never stopped."""
    rounds = [
        "num_rounds=6",
        "checkpoint_every=1",
        "keep_checkpoints=10",
        "secagg=secagg_plus",
        "secagg.degree=4",
        "secagg.dropout=0.1",
        "secagg.threshold=0.4",
        "secagg.dp.mechanism=ddg",
        "secagg.dp.noise_multiplier=0.5",
    ]
    whole = _cli(tmp_path / "whole", *rounds)
    assert whole.returncode == 0, whole.stderr
    third = tmp_path / "whole" / "checkpoints" / "round-000003.ckpt"
    resumed = _cli(tmp_path / "resumed", *rounds, f"resume={third}")
    assert resumed.returncode == 0, resumed.stderr
    final, reference = (load_latest(tmp_path / d / "checkpoints")[1] for d in ("resumed", "whole"))
    assert torch.equal(final["params"], reference["params"])
    assert final["stage/secagg"] == reference["stage/secagg"]
    keys = [k for k in _history(tmp_path / "whole")[0] if k.startswith("secagg/")]
    assert "secagg/dp/epsilon" in keys
    rows = {d: {r["round"]: [r[k] for k in keys] for r in _history(tmp_path / d)} for d in ("resumed", "whole")}
    assert {n: rows["whole"][n] for n in rows["resumed"]} == rows["resumed"] and set(rows["resumed"]) >= {4, 5, 6}
