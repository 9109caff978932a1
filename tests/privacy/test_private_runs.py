"""DP-FedAvg in real runs: the same weights, metrics and ε under every executor and worker count, exact resume of
the ledger and the adaptive clip norm, a clean stop at the privacy budget, noise even in an empty round, the same with
dp.accountant=pld, and one-line refusals of what the accountant does not cover."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("dp_accounting")

from fedsim.cli.run import build_server, compose, run_config  # noqa: E402
from fedsim.core.checkpoint import CheckpointError, load_latest  # noqa: E402
from fedsim.privacy.accountant import PrivacyLedger  # noqa: E402

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
        (
            ["strategy=scaffold"],
            "round: stage 'aggregate' (the strategy fedsim.strategy.scaffold.Scaffold) needs the individual client "
            "updates, which stage 'dp' (dp=central's noisy mean) before it does not pass on; use a strategy of the "
            "mean update",
        ),
        (
            ["strategy=qffl"],
            "dp=central samples clients by Poisson sampling (what the accountant assumes); QFFL samples",
        ),
        (
            ["strategy=krum", "clients_per_round=8"],
            "round: stage 'aggregate' (the strategy fedsim.strategy.robust.Krum)",
        ),
        (["strategy=fedbuff", "clock=sampled"], "dp=central: FedBuff is asynchronous"),
        (["clock=sampled"], "dp=central samples every client with the same probability"),
        (["dp.epsilon_max=0.01"], "dp.epsilon_max=0.01 is below ε="),
        (["dp.noise_multiplier=-1"], "dp.noise_multiplier must be a finite number > 0"),
        (["dp.accountant=moments"], "dp.accountant must be one of rdp, pld (got 'moments')"),
    ],
)
def test_what_the_accountant_does_not_cover_is_refused_in_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError) as error:
        build_server(compose([*SHORT, "dp=central", *overrides]))
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


PLD = [*SHORT, "num_rounds=5", "dp=central", "dp.accountant=pld"]


@pytest.fixture(scope="module")
def pld_reference():
    server = build_server(compose(PLD))
    return server, server.run()


def test_pld_reports_the_librarys_pld_epsilon_below_rdps(pld_reference) -> None:  # noqa: ANN001
    import dp_accounting

    server, result = pld_reference
    epsilons = [r["dp/epsilon"] for r in result.history]
    assert server.parts.privacy.ledger.state_dict()["accountant"] == "pld"
    for rounds in (1, 5):
        accountant = dp_accounting.pld.PLDAccountant()
        event = dp_accounting.PoissonSampledDpEvent(server.parts.privacy.rate, dp_accounting.GaussianDpEvent(1.0))
        accountant.compose(event, rounds)
        assert epsilons[rounds - 1] == accountant.get_epsilon(1e-5)
    rdp = build_server(compose([*PLD, "dp.accountant=rdp"])).run()
    assert torch.equal(rdp.params, result.params)  # the accountant changes the reported ε, nothing else
    assert all(p < r for p, r in zip(epsilons, [r["dp/epsilon"] for r in rdp.history], strict=True))


def test_pld_resume_continues_the_ledger_exactly(tmp_path: Path, pld_reference) -> None:  # noqa: ANN001
    server, reference = pld_reference
    first = tmp_path / "first"
    build_server(compose([*PLD, "num_rounds=2", "checkpoint_every=1"]), first).run()
    ledger = load_latest(first / "checkpoints")[1]["privacy"]["ledger"]
    assert ledger["rounds"] == 2 and ledger["accountant"] == "pld"
    resumed = build_server(compose([*PLD, f"resume={first}"]), tmp_path / "second").run()
    assert torch.equal(resumed.params, reference.params)
    assert _measured_free(resumed.history) == _measured_free(reference.history)
    # another accountant: refused unless allowed; allowed, the same rounds go on under RDP
    with pytest.raises(CheckpointError, match=r"dp.accountant \('pld' -> 'rdp'\)"):
        build_server(compose([*PLD, "dp.accountant=rdp", f"resume={first}"]), tmp_path / "third").run()
    allowed = [*PLD, "dp.accountant=rdp", f"resume={first}", "resume_allow_changes=[dp.accountant]"]
    switched = build_server(compose(allowed), tmp_path / "fourth").run()
    rdp = PrivacyLedger(server.parts.privacy.rate, 1.0, 1e-5)
    assert [r["dp/epsilon"] for r in switched.history[2:]] == [rdp.epsilon(t) for t in (3, 4, 5)]


def test_the_pld_budget_stop_uses_pld_epsilon(tmp_path: Path, pld_reference) -> None:  # noqa: ANN001
    server, reference = pld_reference
    full = reference.history
    budget = (full[2]["dp/epsilon"] + full[3]["dp/epsilon"]) / 2  # between PLD's ε of rounds 3 and 4
    assert budget < PrivacyLedger(server.parts.privacy.rate, 1.0, 1e-5).epsilon(
        3
    )  # RDP would have stopped before round 3
    result = run_config(compose([*PLD, f"dp.epsilon_max={budget}"]), tmp_path)
    assert len(result.history) == 3 and result.history[-1]["dp/epsilon"] == full[2]["dp/epsilon"]
    assert result.stop_reason.startswith(
        f"privacy budget: round 4 would bring ε to {full[3]['dp/epsilon']:.4g} > dp.epsilon_max="
    )
