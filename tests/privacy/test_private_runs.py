"""DP-FedAvg in real runs: the same weights, metrics and ε under every executor and worker count, exact resume of
the ledger and the adaptive clip norm, a clean stop at the privacy budget, noise even in an empty round, and one-line
refusals of what the accountant does not cover."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("dp_accounting")

from fedsim.cli.run import build_server, compose, run_config  # noqa: E402
from fedsim.core.checkpoint import load_latest  # noqa: E402

SHORT = ["num_rounds=4", "logger=quiet", "clients_per_round=5", "eval_every=2"]
ADAPTIVE = [*SHORT, "dp=adaptive", "dp.noise_multiplier=0.8", "dp.count_noise=0.5"]


def _measured_free(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "system/"))} for r in history]


@pytest.fixture(scope="module")
def adaptive_reference():
    return build_server(compose(ADAPTIVE)).run()


def test_a_private_round_reports_epsilon_clip_norm_and_the_poisson_cohort(adaptive_reference) -> None:  # noqa: ANN001
    history = adaptive_reference.history
    epsilons = [r["dp/epsilon"] for r in history]
    assert all(b > a > 0 for a, b in zip(epsilons, epsilons[1:], strict=False))
    clips = [r["dp/clip_norm"] for r in history]
    assert clips[0] == 0.1 and len(set(clips)) == len(clips)  # adaptive: it moves every round
    cohorts = [r["dp/cohort"] for r in history]
    assert cohorts == [r["client/num_aggregated"] for r in history] and len(set(cohorts)) > 1  # Poisson: sizes vary


@pytest.mark.parametrize("workers", [1, 3])
def test_process_workers_give_the_serial_weights_metrics_and_epsilon(workers: int, adaptive_reference) -> None:  # noqa: ANN001
    result = build_server(
        compose([*ADAPTIVE, "executor=process", "executor.devices=cpu", f"executor.workers={workers}"])
    ).run()
    assert torch.equal(result.params, adaptive_reference.params)
    assert _measured_free(result.history) == _measured_free(adaptive_reference.history)


def test_resume_continues_the_ledger_and_the_clip_norm_exactly(tmp_path: Path, adaptive_reference) -> None:  # noqa: ANN001
    first = tmp_path / "first"
    build_server(compose([*ADAPTIVE, "num_rounds=2", "checkpoint_every=1"]), first).run()
    state = load_latest(first / "checkpoints")[1]["privacy"]
    assert state["ledger"]["rounds"] == 2 and state["clip_norm"] == pytest.approx(
        adaptive_reference.history[2]["dp/clip_norm"]
    )
    resumed = build_server(compose([*ADAPTIVE, f"resume={first}"]), tmp_path / "second").run()
    assert torch.equal(resumed.params, adaptive_reference.params)
    assert _measured_free(resumed.history) == _measured_free(adaptive_reference.history)


def test_the_run_stops_cleanly_before_the_round_that_would_exceed_epsilon_max(tmp_path: Path) -> None:
    full = build_server(compose([*SHORT, "num_rounds=10", "dp=central"])).run().history
    budget = (full[5]["dp/epsilon"] + full[6]["dp/epsilon"]) / 2  # between rounds 6 and 7
    result = run_config(compose([*SHORT, "num_rounds=10", "dp=central", f"dp.epsilon_max={budget}"]), tmp_path)
    assert len(result.history) == 6 and result.history[-1]["dp/epsilon"] <= budget
    assert result.stop_reason.startswith(
        f"privacy budget: round 7 would bring ε to {full[6]['dp/epsilon']:.4g} > dp.epsilon_max="
    )
    assert json.loads((tmp_path / "summary.json").read_text())["stop_reason"] == result.stop_reason
    assert load_latest(tmp_path / "checkpoints")[1]["round"] == 6


def test_an_empty_round_still_adds_noise_and_counts() -> None:
    history = (
        build_server(compose([*SHORT, "num_rounds=12", "clients_per_round=1", "dp=central", "eval_every=1"]))
        .run()
        .history
    )
    empty = [i for i, r in enumerate(history) if r["dp/cohort"] == 0 and i > 0]
    assert empty, "no empty round in this seed's draws"
    i = empty[0]
    assert history[i]["eval/loss"] != history[i - 1]["eval/loss"]  # the model moved: noise only
    assert history[i]["dp/epsilon"] > history[i - 1]["dp/epsilon"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["strategy=scaffold"], "dp=central: Scaffold aggregates per-client information"),
        (["strategy=qffl"], "dp=central: QFFL aggregates per-client information"),
        (["strategy=fedbuff", "clock=sampled"], "dp=central: FedBuff aggregates per-client information"),
        (["clock=sampled"], "dp=central samples every client with the same probability"),
        (["dp.epsilon_max=0.01"], "dp.epsilon_max=0.01 is below ε="),
        (["dp.noise_multiplier=-1"], "dp.noise_multiplier must be > 0"),
    ],
)
def test_what_the_accountant_does_not_cover_is_refused_in_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError) as error:
        build_server(compose([*SHORT, "dp=central", *overrides]))
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
