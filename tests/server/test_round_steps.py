"""A researcher's own round steps (fedsim/server/stage.py, compose.py): the example stages of
experiments/round_steps/clip_stages.py, a module outside fedsim, run from Python (``Stages(extra=[...])``) and from
the command line (``round.extra``); their metrics reach metrics.jsonl and TensorBoard under their name; they give the
same weights under every executor; a stateful one resumes exactly after kill -9; their declarations decide whether
central DP runs with them. Also the rules of positions, names and declarations, and the built-in capabilities placed
by the same mechanism."""

from __future__ import annotations

import functools
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
from builders import sgd, tiny_federation, tiny_server
from cli_runner import run_cli
from own_processes import live_tagged, new_tag, tagged_environment
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedsim.client.base import Client
from fedsim.core.checkpoint import CheckpointError, load_latest, save_checkpoint
from fedsim.executor import ProcessExecutor, RayExecutor
from fedsim.server import RoundRecord, RoundStage, Server
from fedsim.server.settings import Checkpoints, Stages
from fedsim.server.stage import CLOCK, UPDATES, check_declarations, check_names, place, stage_metrics

STAGES_DIR = Path(__file__).resolve().parents[2] / "experiments" / "round_steps"
sys.path.insert(0, str(STAGES_DIR))
from clip_stages import AdaptiveClip, ClipAggregate  # noqa: E402  (the researcher's module, outside fedsim)

FAST = ["data.num_devices=12", "clients_per_round=4", "logger.progress=false"]
CLIP = "round.extra=[{_target_: clip_stages.ClipAggregate, max_norm: 0.05}]"
ADAPTIVE = "round.extra=[{_target_: clip_stages.AdaptiveClip, initial: 0.05, quantile: 0.5, lr: 0.3}]"


# --- positions, names and declarations ------------------------------------------------------------------------


class _Named(RoundStage):
    def __init__(self, name: str, position: str = "", needs: Any = frozenset(), preserves: Any = None) -> None:
        self.name, self.position, self.needs, self.preserves = name, position, needs, preserves

    def run(self, record: RoundRecord) -> None:
        return None


BASE = [_Named(n) for n in ("plan", "dispatch", "receive", "aggregate", "measure")]


def _names(stages: list[RoundStage]) -> list[str]:
    return [s.name for s in stages]


def test_stages_go_where_their_positions_say_in_the_order_they_were_added() -> None:
    added = [
        _Named("a", "after aggregate"),
        _Named("b", "before aggregate"),
        _Named("c", "after aggregate"),
        _Named("d", "before aggregate"),
        _Named("e", "after c"),
        _Named("p", "instead of plan"),
    ]
    placed = place(BASE, added)
    assert _names(placed) == ["plan", "dispatch", "receive", "b", "d", "aggregate", "a", "c", "e", "measure"]
    assert placed[0] is added[-1]  # "instead of plan" takes plan's place and name
    again = place(placed, [_Named("q", "before plan")])
    assert _names(again)[:2] == ["q", "plan"] and again[1] is added[-1]


@pytest.mark.parametrize(
    ("stage", "message"),
    [
        (_Named("x", "after nowhere"), "is placed 'after nowhere', but this round has no stage 'nowhere' (its stages:"),
        (_Named("x", "next to aggregate"), "has position 'next to aggregate'; say 'before X', 'after X' or"),
        (_Named("x", ""), "has position ''"),
    ],
)
def test_a_position_that_does_not_fit_is_one_line(stage: RoundStage, message: str) -> None:
    with pytest.raises(ValueError, match="^round: stage 'x'") as error:
        place(BASE, [stage])
    assert message in str(error.value) and "\n" not in str(error.value)


def test_two_stages_cannot_take_one_place() -> None:
    with pytest.raises(ValueError, match="stage 'q' .* would replace 'plan', which 'plan' .* replaces already"):
        place(BASE, [_Named("p", "instead of plan"), _Named("q", "instead of plan")])


@pytest.mark.parametrize(
    ("name", "message"),
    [("eval", "a metric namespace of fedsim"), ("aggregate", "another stage of the round has it"), ("Clip", "lower")],
)
def test_a_name_that_would_collide_is_refused(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_names(BASE, [_Named(name, "after aggregate")])


def test_a_stage_needing_what_an_earlier_stage_took_away_is_refused_naming_both() -> None:
    hides = _Named("secagg", "before aggregate", needs=frozenset({UPDATES}), preserves=frozenset())
    reads = _Named("robust", "after secagg", needs=frozenset({UPDATES}))
    undeclared = _Named("mine", "after aggregate", needs=None)
    early = _Named("early", "before secagg", needs=frozenset({UPDATES}))
    check_declarations(place(BASE, [hides, early]), {UPDATES})  # reads them before they are hidden: fine
    for late in (reads, undeclared):
        with pytest.raises(ValueError) as error:
            check_declarations(place(BASE, [hides, late]), {UPDATES})
        line = str(error.value)
        assert f"stage '{late.name}'" in line and "needs the individual client updates" in line
        assert "which stage 'secagg'" in line and "before it does not pass on" in line and "\n" not in line
    assert "it declares no needs" in line
    with pytest.raises(ValueError, match="needs the simulated clock, which this run does not have"):
        check_declarations(place(BASE, [_Named("t", "after plan", needs=frozenset({CLOCK}))]), {UPDATES})


def test_a_stages_metrics_are_logged_under_its_name() -> None:
    stage = _Named("clip")
    assert stage_metrics(stage, {"norm": torch.tensor(2.5), "n": 3}) == {"clip/norm": 2.5, "clip/n": 3.0}
    with pytest.raises(TypeError, match="'clip' .* returned norm='big', not a real number"):
        stage_metrics(stage, {"norm": "big"})


# --- from Python ----------------------------------------------------------------------------------------------


def _server(*extra: RoundStage, executor: Any = None, checkpoint_dir: Path | None = None, rounds: int = 4) -> Server:
    return tiny_server(
        tiny_federation(12, num_features=10, num_classes=5, min_size=30),
        client=functools.partial(Client, epochs=2, batch_size=10, optimizer=sgd(0.1)),
        executor=executor,
        num_rounds=rounds,
        seed=1,
        checkpoints=Checkpoints(checkpoint_dir) if checkpoint_dir is not None else None,
        stages=Stages(extra=list(extra)),
    )


def test_clipping_the_aggregate_is_the_known_answer_of_every_round() -> None:
    """Each round: the new weights are the old plus FedAvg's update scaled to at most max_norm, as computed here
    from the same round without the stage (the same sample, the same updates)."""
    clipped, plain = _server(ClipAggregate(max_norm=0.05), rounds=3), _server(rounds=3)
    for server in (clipped, plain):
        server.parts.executor.start(server.workload())  # as Server.run does
    hits = []
    for round_num in (1, 2, 3):
        start = clipped.params
        plain.params = start  # the plain round from the same weights: FedAvg's unclipped aggregate
        plain.run_round(round_num)
        delta = plain.params - start
        metrics = clipped.run_round(round_num)
        norm = float(delta.norm())
        expected = start + delta * (0.05 / norm) if norm > 0.05 else start + delta
        assert torch.equal(clipped.params, expected)
        assert metrics["clip/pre_clip_norm"] == norm and metrics["clip/clipped"] == float(norm > 0.05)
        hits.append(norm > 0.05)
    assert any(hits), "the bound should bind in at least one round of this run"


def test_a_stage_state_is_in_the_checkpoint_and_a_missing_or_foreign_one_is_refused(tmp_path: Path) -> None:
    _server(AdaptiveClip(initial=0.05), checkpoint_dir=tmp_path / "run", rounds=2).run()
    path, state = load_latest(tmp_path / "run")
    assert set(state["stage/adaptive_clip"]) == {"bound"} and state["stage/adaptive_clip"]["bound"] != 0.05
    with pytest.raises(CheckpointError, match=r"holds the state of round stage\(s\) this run does not have \(adaptive"):
        _server(rounds=3).resume(path)
    state.pop("stage/adaptive_clip")
    stripped = save_checkpoint(tmp_path / "stripped", 2, state)
    with pytest.raises(CheckpointError, match="without the state of round stage 'adaptive_clip'; resume with"):
        _server(AdaptiveClip(), rounds=3).resume(stripped)


# --- from the command line ------------------------------------------------------------------------------------


def _cli(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return run_cli([*FAST, *overrides, f"hydra.run.dir={run_dir}"], pythonpath=[STAGES_DIR])


def _history(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_stage_from_the_command_line_logs_its_metric_to_metrics_jsonl_and_tensorboard(tmp_path: Path) -> None:
    done = _cli(tmp_path, CLIP, "num_rounds=3")
    assert done.returncode == 0, done.stderr
    norms = [r["clip/pre_clip_norm"] for r in _history(tmp_path)]
    assert len(norms) == 3 and all(n > 0 for n in norms)
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0}).Reload()
    logged = [(e.step, e.value) for e in events.Scalars("clip/pre_clip_norm")]
    assert logged == [(i + 1, pytest.approx(n, rel=1e-6)) for i, n in enumerate(norms)]  # float32 in the event file


def test_central_dp_runs_with_a_stage_that_declares_it_reads_the_aggregate_and_refuses_one_that_does_not(
    tmp_path: Path,
) -> None:
    declared = _cli(tmp_path / "a", CLIP, "dp=central", "num_rounds=2")
    assert declared.returncode == 0, declared.stderr
    assert all("clip/pre_clip_norm" in r and "dp/epsilon" in r for r in _history(tmp_path / "a"))
    refused = _cli(tmp_path / "b", CLIP.replace("ClipAggregate", "UndeclaredClipAggregate"), "dp=central")
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "fedsim: error: round: stage 'clip' (clip_stages.UndeclaredClipAggregate) needs the individual client "
        "updates (it declares no needs, so it is taken to read them), which stage 'dp' (dp=central's noisy mean) "
        "before it does not pass on; if it reads only the aggregate, declare needs = frozenset() "
        "(docs/writing-a-round-step.md)"
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("round.extra=[clip_stages.ClipAggregate]", "round.extra[0] must be a stage entry {_target_: your_module"),
        ("round.extra=[{_target_: clip_stages.ClipAggregate, max_norm: -1}]", "round.extra: ClipAggregate max_norm"),
        ("round.extra=[{_target_: builtins.dict}]", "round.extra[0]._target_=builtins.dict builds a dict, not a"),
        (
            "round.extra=[{_target_: clip_stages.ClipAggregate, position: after nowhere}]",
            "round: stage 'clip' (clip_stages.ClipAggregate) is placed 'after nowhere', but this round has no stage",
        ),
        (
            "round.extra=[{_target_: clip_stages.ClipAggregate, name: eval}]",
            "round: stage 'eval' (clip_stages.ClipAggregate) may not be named 'eval': a metric namespace of fedsim",
        ),
    ],
)
def test_a_bad_round_extra_entry_is_one_line_before_any_work(tmp_path: Path, override: str, message: str) -> None:
    done = _cli(tmp_path, override)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fedsim: error: {message}"), done.stderr
    assert not (tmp_path / "metrics.jsonl").exists()


def test_an_entry_sets_the_position_and_the_name_of_its_stage(tmp_path: Path) -> None:
    done = _cli(tmp_path, "round.extra=[{_target_: clip_stages.ClipAggregate, name: early, position: before commit}]")
    assert done.returncode == 0, done.stderr
    assert "early/pre_clip_norm" in _history(tmp_path)[0]


# --- every executor, and resume -------------------------------------------------------------------------------


@pytest.mark.slow
def test_serial_process_and_ray_give_the_same_weights_with_a_stage(local_ray) -> None:  # noqa: ANN001
    runs = {
        "serial": _server(AdaptiveClip(initial=0.05)).run(),
        "process": _server(AdaptiveClip(initial=0.05), executor=ProcessExecutor(devices="cpu", workers=2)).run(),
        "ray": _server(AdaptiveClip(initial=0.05), executor=RayExecutor(workers=2, reuse_actors=True)).run(),
    }
    for name in ("process", "ray"):
        assert torch.equal(runs[name].params, runs["serial"].params), name
        assert [r["adaptive_clip/bound"] for r in runs[name].history] == [
            r["adaptive_clip/bound"] for r in runs["serial"].history
        ]


@pytest.fixture
def own() -> Iterator[str]:
    tag = new_tag()
    yield tag
    assert not live_tagged(tag)


@pytest.mark.slow
def test_a_stateful_stage_resumes_exactly_after_kill_9(tmp_path: Path, own: str) -> None:
    rounds = ["num_rounds=12", "checkpoint_every=1", ADAPTIVE]
    whole = _cli(tmp_path / "whole", *rounds)
    assert whole.returncode == 0, whole.stderr
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedsim", *FAST, *rounds, f"hydra.run.dir={run_dir}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**tagged_environment(own), "PYTHONPATH": str(STAGES_DIR)},
    )
    deadline = time.monotonic() + 120
    while not (run_dir / "metrics.jsonl").exists() or len(_history(run_dir)) < 4:
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert len(_history(run_dir)) < 12, "killed before the end"
    resumed = _cli(run_dir, *rounds, "resume=true")
    assert resumed.returncode == 0, resumed.stderr
    final = load_latest(run_dir / "checkpoints")[1]["params"]
    assert torch.equal(final, load_latest(tmp_path / "whole" / "checkpoints")[1]["params"])
    stage = [(r["adaptive_clip/bound"], r["adaptive_clip/pre_clip_norm"]) for r in _history(run_dir)]
    assert stage == [(r["adaptive_clip/bound"], r["adaptive_clip/pre_clip_norm"]) for r in _history(tmp_path / "whole")]


# --- the built-in capabilities are stages too -----------------------------------------------------------------


def test_the_capabilities_are_stages_placed_like_a_researchers(tmp_path: Path) -> None:
    from fedsim.cli.run import build_server, compose

    cfg = [*FAST, "num_rounds=1", "dp=central", "attack=sign_flip", "stragglers.fraction=0.5", "client.epochs=2"]
    server = build_server(compose(cfg))
    assert _names(server.stages) == [
        "plan", "dispatch", "attack", "upload", "receive", "stragglers", "dp", "aggregate", "commit", "measure",
        "attack_report", "evaluate", "backdoor",
    ]  # fmt: skip
    assert type(server.stages[0]).__name__ == "PrivatePlan"
    clocked = build_server(compose([*FAST, "num_rounds=1", "clock=sampled"]))
    assert type(clocked.stages[0]).__name__ == "ClockedPlan" and _names(clocked.stages)[-3:] == [
        "measure", "clock", "evaluate",
    ]  # fmt: skip
    buffered = build_server(compose(["data.num_devices=40", "num_rounds=1", "strategy=fedbuff", "clock=sampled"]))
    assert _names(buffered.stages) == ["aggregate", "commit", "measure", "evaluate"]
