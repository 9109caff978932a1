"""experiments/custom_strategy: a user's strategies outside the fedsim package.

Known answers for ``ClippedFedAvg`` and ``L1TowardsGlobal``, then the README's commands, run as a user
would (from the repository root, ``PYTHONPATH=experiments/custom_strategy``), with the serial and the
process executor. Each assertion fails if the user's class is not the one that ran.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_runner import run_cli
from torch import nn

from fedsim.core.types import ClientUpdate
from fedsim.strategy import FedAvg

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "experiments" / "custom_strategy"
sys.path.insert(0, str(EXAMPLE))

from my_strategies import AdaptiveClippedFedAvg, ClippedFedAvg, L1FedAvg, L1TowardsGlobal  # noqa: E402

PROCESS = ["executor=process", "executor.devices=cpu", "executor.workers=2"]
CLIPPED = ["strategy._target_=my_strategies.ClippedFedAvg", "+strategy.max_norm=1e-6"]
L1 = ["strategy._target_=my_strategies.L1FedAvg", "+strategy.lam=0.1"]
SEARCHPATH = [
    "hydra.searchpath=[file://experiments/custom_strategy/conf]",
    "strategy=clipped_fedavg",
    "strategy.max_norm=1e-6",
]


def _update(client_id: int, values: list[float], n: int) -> ClientUpdate:
    return ClientUpdate(client_id=client_id, round_num=1, params=torch.tensor(values), num_examples=n)


# --- known answers ---------------------------------------------------------------------------------------------


def test_clipped_fedavg_known_answer() -> None:
    # global (1, 1); client 0 moves by (3, 4) (norm 5) and is clipped to (0.6, 0.8); client 1 moves by
    # (0, -0.5) (norm 0.5) and is kept. Weighted 1 : 3 -> ((1.6 + 3·1) / 4, (1.8 + 3·0.5) / 4) = (1.15, 0.825)
    updates = [_update(0, [4.0, 5.0], 1), _update(1, [1.0, 0.5], 3)]
    new = ClippedFedAvg(max_norm=1.0).aggregate(1, torch.tensor([1.0, 1.0]), updates)
    assert new.dtype == torch.float32
    assert torch.equal(new, torch.tensor([1.15, 0.825]))


def test_clipped_fedavg_is_fedavg_when_nothing_is_clipped() -> None:
    updates = [_update(0, [0.1, -0.2, 0.3], 2), _update(4, [0.0, 0.25, -0.5], 5), _update(9, [0.3, 0.1, 0.1], 1)]
    global_params = torch.tensor([0.1, 0.0, 0.0])
    clipped = ClippedFedAvg(max_norm=10.0).aggregate(1, global_params, updates)
    assert torch.equal(clipped, FedAvg().aggregate(1, global_params, updates))


@pytest.mark.parametrize("bad", [0, -1.0, True, "1"])
def test_clipped_fedavg_rejects_bad_max_norm(bad: Any) -> None:
    with pytest.raises(ValueError, match="strategy.max_norm"):
        ClippedFedAvg(max_norm=bad)


def test_adaptive_clipping_moves_the_bound_and_restores_its_state() -> None:
    # C = 1: changes of norm 0.5 (kept), 2 and 3 (clipped to 1); b = 1/3 below C, so C grows by exp(0.2·(0.5 − 1/3))
    updates = [_update(0, [0.5, 0.0], 1), _update(1, [0.0, 2.0], 1), _update(2, [-3.0, 0.0], 2)]
    strategy = AdaptiveClippedFedAvg(quantile=0.5, norm_lr=0.2, initial_norm=1.0)
    new = strategy.aggregate(1, torch.zeros(2), updates)
    assert torch.allclose(new, torch.tensor([(0.5 - 2.0) / 4, 1.0 / 4]), rtol=0, atol=1e-7)
    assert strategy.state_dict() == {"max_norm": pytest.approx(math.exp(0.2 / 6))}
    restored = AdaptiveClippedFedAvg()
    restored.load_state_dict(strategy.state_dict())
    assert torch.equal(restored.aggregate(2, new, updates), strategy.aggregate(2, new, updates))


def test_l1_term_known_answer_and_gradient() -> None:
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
        model.bias.copy_(torch.tensor([0.5]))
    term = L1TowardsGlobal()
    term.begin(model, L1FedAvg(lam=0.5).client_config(1, 0))
    assert float(term.loss_term(model).detach()) == 0.0  # at the global weights
    with torch.no_grad():
        model.weight.add_(torch.tensor([[1.0, -2.0]]))  # moved by (1, -2); bias unchanged
    value = term.loss_term(model)
    assert float(value.detach()) == 0.5 * (1.0 + 2.0)  # lam * ||w - w_global||_1
    value.backward()
    assert torch.equal(model.weight.grad, torch.tensor([[0.5, -0.5]]))  # lam * sign(w - w_global)
    term.begin(model, {})
    assert term.loss_term(model) is None  # no lam sent: the term is off


def test_l1_functional_term_equals_loss_term() -> None:
    """The vectorised form (for executor=vmap) gives the same value and gradient as loss_term."""
    model = nn.Linear(3, 2)
    term = L1TowardsGlobal()
    term.begin(model, {"l1_lambda": 0.25})
    anchor = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        model.weight.add_(torch.randn(2, 3))
    params = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    functional = term.functional_term(params, anchor, {"l1_lambda": torch.tensor(0.25)})
    eager = term.loss_term(model)
    assert torch.allclose(functional, eager)
    functional.backward()
    eager.backward()
    assert torch.equal(params["weight"].grad, model.weight.grad)
    assert term.functional_term(params, anchor, {}) is None


# --- the README's commands ---------------------------------------------------------------------------------------


def _run(args: list[str], run_dir: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``PYTHONPATH=experiments/custom_strategy python -m fedsim ARGS`` from the repository root, in this process."""
    proc = run_cli([*args, "num_rounds=3", "logger=quiet", f"hydra.run.dir={run_dir}"], cwd=ROOT, pythonpath=[EXAMPLE])
    return proc, run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    base = tmp_path_factory.mktemp("custom_strategy")
    cases = {
        "fedavg": [],
        "clipped": CLIPPED,
        "clipped_process": CLIPPED + PROCESS,
        "clipped_searchpath": SEARCHPATH,
        "l1": L1,
        "l1_process": L1 + PROCESS,
        "l1_vmap": L1 + ["executor=vmap"],
    }
    results = {name: _run(args, base / name) for name, args in cases.items()}
    records = {}
    for name, (proc, run_dir) in results.items():
        assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
        assert "final test accuracy" in proc.stdout
        records[name] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return records


def _outcome(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Everything a run computed, without timings and worker names."""
    keys = ("round", "train/loss", "eval/loss", "eval/accuracy", "client/num_aggregated")
    return [tuple(r[k] for k in keys) + tuple((c["client_id"], c["train_loss"]) for c in r["clients"]) for r in records]


def test_tiny_max_norm_keeps_the_model_almost_still(runs: dict[str, list[dict[str, Any]]]) -> None:
    clipped, fedavg = runs["clipped"], runs["fedavg"]
    assert [r["round"] for r in clipped] == [1, 2, 3]
    assert all(r["client/num_aggregated"] == 10 and r["train/loss"] > 0 for r in clipped)  # clients trained
    spread = lambda records: max(r["eval/loss"] for r in records) - min(r["eval/loss"] for r in records)  # noqa: E731
    # the global model moves at most 1e-6 per round with ClippedFedAvg; FedAvg moves it visibly
    assert spread(clipped) < 1e-4
    assert spread(fedavg) > 1e-2


def test_process_executor_gives_the_serial_answer_for_the_user_strategy(runs: dict[str, list[dict[str, Any]]]) -> None:
    assert _outcome(runs["clipped_process"]) == _outcome(runs["clipped"])
    workers = {c["worker"] for r in runs["clipped_process"] for c in r["clients"]}
    assert workers == {"w0", "w1"}


def test_option_file_on_the_searchpath_selects_the_same_strategy(runs: dict[str, list[dict[str, Any]]]) -> None:
    assert _outcome(runs["clipped_searchpath"]) == _outcome(runs["clipped"])


def test_client_half_runs_in_spawned_workers(runs: dict[str, list[dict[str, Any]]]) -> None:
    # the L1 term changes local training (so the result differs from FedAvg) and the workers, which
    # import my_strategies through PYTHONPATH, apply it exactly as the serial executor does
    assert _outcome(runs["l1"]) != _outcome(runs["fedavg"])
    assert _outcome(runs["l1_process"]) == _outcome(runs["l1"])
    assert {c["worker"] for r in runs["l1_process"] for c in r["clients"]} == {"w0", "w1"}


def test_client_half_runs_under_vmap(runs: dict[str, list[dict[str, Any]]]) -> None:
    # executor=vmap runs the L1 term through its functional_term: the serial run's numbers up to float rounding
    vmap, serial = runs["l1_vmap"], runs["l1"]
    assert {c["worker"] for r in vmap for c in r["clients"]} == {"vmap0"}
    for v, s in zip(vmap, serial, strict=True):
        assert v["eval/loss"] == pytest.approx(s["eval/loss"], rel=1e-5)
        assert [c["train_loss"] for c in v["clients"]] == pytest.approx(
            [c["train_loss"] for c in s["clients"]], rel=1e-5
        )
