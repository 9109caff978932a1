"""Accuracy against simulated time (issue #18, item 5): ``fedsim.report --x sim_time``, the simulated seconds to
a target, and TensorBoard's ``by_sim_time/`` scalars. Hand-written ``metrics.jsonl`` files with hand-computed
numbers, real clocked runs, and event files read back with TensorBoard's own reader."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedsim.observe.run_logger import RunLogger
from fedsim.observe.tensorboard_log import add_sim_time_scalars, after_existing_files, sim_time_scalars
from fedsim.report import command as report
from fedsim.report import plot as report_plot

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def clocked_run(root: Path, name: str, rounds: list[tuple[float | None, float | None]], overrides: list[str]) -> Path:
    """A run dir as fedsim writes it: ``rounds`` are ``(sim/time_s, eval/accuracy)`` per round (``None``: the
    round did not log it); metrics.jsonl, summary.json and .hydra/{overrides,config}.yaml."""
    run_dir = root / name
    (run_dir / ".hydra").mkdir(parents=True)
    records = []
    for i, (clock, acc) in enumerate(rounds, start=1):
        record: dict[str, Any] = {"round": i, "train/loss": 1.0, "client/num_sampled": 3.0}
        if clock is not None:
            record |= {
                "sim/time_s": clock,
                "sim/round_s": clock - (records[-1].get("sim/time_s", 0.0) if records else 0.0),
                "sim/online": 10.0,
                "sim/utilisation": 0.5,
            }
        if acc is not None:
            record |= {"eval/loss": 1.0 - acc, "eval/accuracy": acc}
        records.append(record | {"time/round_s": 0.01})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    seed = int(next(o.split("=")[1] for o in overrides if o.startswith("seed=")))
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "num_rounds": len(rounds)}))
    (run_dir / "summary.json").write_text(
        json.dumps({"rounds": len(rounds), "wall_time_s": 0.1, "finished": True, "stop_reason": "completed"})
    )
    return run_dir


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """Config a: seed 0 at 10/20/30 s, seed 1 at 15/25 s (an unevaluated round at 20 s); config b: no clock."""
    root = tmp_path / "sweep"
    clocked_run(root, "0_seed=0,strategy=a", [(10.0, 0.2), (20.0, 0.5), (30.0, 0.6)], ["strategy=a", "seed=0"])
    clocked_run(root, "1_seed=1,strategy=a", [(15.0, 0.4), (20.0, None), (25.0, 0.7)], ["strategy=a", "seed=1"])
    clocked_run(root, "2_seed=0,strategy=b", [(None, 0.3), (None, 0.65)], ["strategy=b", "seed=0"])
    return root


def _groups(root: Path) -> dict[tuple[str, ...], list[report.Run]]:
    return report.group_runs(report.load_runs(root, series=["eval/loss"]))


# ---------------------------------------------------------------- the mean curve over seeds on simulated time


def test_mean_curve_on_sim_time_takes_each_seeds_latest_value_on_the_union_of_times(sweep: Path) -> None:
    curve = report.mean_curve(_groups(sweep)[("strategy=a",)], x="sim_time")
    # at 10 s only seed 0 has a value (0.2); at 15 s seed 1 joins (0.4); at 20 s seed 0 has 0.5, seed 1 still 0.4
    # (its 20 s round was not evaluated); at 25 s 0.5 and 0.7; at 30 s seed 1 keeps 0.7 after its last round
    expected = [
        (10, 0.2, 0.2, 0.2),
        (15, 0.3, 0.2, 0.4),
        (20, 0.45, 0.4, 0.5),
        (25, 0.6, 0.5, 0.7),
        (30, 0.65, 0.6, 0.7),
    ]
    for got, want in zip(curve, expected, strict=True):
        assert got == pytest.approx(want)
    loss = report.mean_curve(_groups(sweep)[("strategy=a",)], "eval/loss", "sim_time")  # any scalar: 1 - accuracy
    assert [v for t, m, *_ in loss for v in (t, m)] == pytest.approx([v for t, m, *_ in expected for v in (t, 1 - m)])
    assert report.mean_curve(_groups(sweep)[("strategy=b",)], x="sim_time") == []  # no clock, no points


def test_seconds_to_target_is_the_clock_at_the_first_round_reaching_it(sweep: Path) -> None:
    runs = {r.path.name: r for r in report.load_runs(sweep)}
    assert runs["0_seed=0,strategy=a"].sim_time == ((1, 10.0), (2, 20.0), (3, 30.0))
    assert report.seconds_to_target(runs["0_seed=0,strategy=a"], 0.5) == 20.0
    assert report.seconds_to_target(runs["1_seed=1,strategy=a"], 0.5) == 25.0
    assert report.seconds_to_target(runs["1_seed=1,strategy=a"], 0.8) is None
    assert report.seconds_to_target(runs["2_seed=0,strategy=b"], 0.5) is None  # reached it, but no clock


# ---------------------------------------------------------------- the table and report.csv


def test_table_and_csv_give_simulated_seconds_to_target(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = sweep / "out"
    assert report.main([str(sweep), "--target", "0.5", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert re.search(r"rounds to 0\.5\s+sim s to 0\.5\s+wall s$", lines[0])
    # seeds reach 0.5 at 20 s and 25 s: mean 22.5, sample std sqrt(12.5) = 3.5355
    assert re.search(r"^strategy=a .*\s2\.5 \(2/2\)\s+22\.5 ± 3\.5 \(2/2\)\s+0\.1$", lines[1])
    assert re.search(r"^strategy=b .*\s2 \(1/1\)\s+- \(no clock\)\s+0\.1$", lines[2])
    with open(out / "report.csv") as csv_file:
        a, b = csv.DictReader(csv_file)
    assert float(a["sim_seconds_to_target_mean"]) == 22.5
    assert float(a["sim_seconds_to_target_std"]) == pytest.approx(math.sqrt(12.5))
    assert a["seeds_reached_target_sim"] == "2" and a["seeds_reached_target"] == "2"
    assert (b["sim_seconds_to_target_mean"], b["sim_seconds_to_target_std"], b["seeds_reached_target_sim"]) == (
        "",
        "",
        "0",
    )


def test_seeds_that_missed_the_target_are_counted_not_averaged(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main([str(sweep), "--target", "0.65", "--out", str(sweep / "out")]) == 0  # only seed 1, at 25 s
    assert re.search(r"^strategy=a .*\s3 \(1/2\)\s+25\.0 \(1/2\)\s", capsys.readouterr().out.splitlines()[1])
    assert report.main([str(sweep), "--target", "0.9", "--out", str(sweep / "out")]) == 0
    assert re.search(r"^strategy=a .*\s- \(0/2\)\s+- \(0/2\)\s", capsys.readouterr().out.splitlines()[1])
    with open(sweep / "out" / "report.csv") as csv_file:
        a, _ = csv.DictReader(csv_file)
    assert (a["sim_seconds_to_target_mean"], a["seeds_reached_target_sim"]) == ("", "0")


def test_without_a_clock_nothing_changes(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = sweep / "2_seed=0,strategy=b"
    assert report.main([str(b), "--target", "0.5", "--out", str(sweep / "out")]) == 0
    assert "sim s" not in capsys.readouterr().out
    with open(sweep / "out" / "report.csv") as csv_file:
        (row,) = csv.DictReader(csv_file)
    assert not [name for name in row if "sim" in name]


# ---------------------------------------------------------------- --x sim_time


def test_x_sim_time_plots_and_names_runs_without_a_clock(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = sweep / "out"
    assert (
        report.main(
            [str(sweep), "--x", "sim_time", "--plot", "eval/accuracy", "--plot", "eval/loss", "--out", str(out)]
        )
        == 0
    )
    text = capsys.readouterr().out
    notes = [line for line in text.splitlines() if line.startswith("fedsim.report:")]
    assert notes == [
        "fedsim.report: 2_seed=0,strategy=b logged no sim/time_s (no clock); left out of the sim_time plots"
    ]
    assert text.splitlines()[-1] == f"wrote {out / 'report.csv'}, {out / 'accuracy.png'}, {out / 'eval_loss.png'}"
    assert (out / "accuracy.png").read_bytes()[:8] == PNG_MAGIC
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = report_plot.draw(_groups(sweep), x="sim_time")
    FigureCanvasAgg(fig).draw()
    (ax,) = fig.axes
    assert ax.get_xlabel() == "simulated time, s (sim/time_s)"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["strategy=a (2 seeds)"]  # b has nothing to draw
    assert list(ax.get_lines()[0].get_xdata()) == [10, 15, 20, 25, 30]


def test_x_sim_time_without_any_clock_says_so_once(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = sweep / "2_seed=0,strategy=b"
    assert report.main([str(b), "--x", "sim_time", "--out", str(sweep / "out")]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fedsim.report:")]
    assert notes == [
        "fedsim.report: no run logged sim/time_s (run with clock=sampled or clock=trace); nothing to plot "
        "against sim_time",
        "fedsim.report: no run logged eval/accuracy with sim/time_s; skipped accuracy.png",
    ]
    assert not (sweep / "out" / "accuracy.png").exists()


def test_real_clocked_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedsim.cli.run import compose, run_config

    root = tmp_path / "sweep"
    for seed in (0, 1):
        run_config(
            compose(
                [
                    "clock=sampled",
                    "num_rounds=3",
                    "logger=quiet",
                    "data.num_devices=10",
                    "clients_per_round=3",
                    f"seed={seed}",
                ]
            ),
            run_dir=root / f"{seed}_seed={seed}",
        )
    records = [
        [json.loads(line) for line in (root / f"{s}_seed={s}" / "metrics.jsonl").read_text().splitlines()]
        for s in (0, 1)
    ]
    target = min(r["eval/accuracy"] for rs in records for r in rs)  # every seed reaches it in round 1
    assert report.main([str(root), "--x", "sim_time", "--target", f"{target}", "--out", str(tmp_path / "out")]) == 0
    assert "logged no sim/time_s" not in capsys.readouterr().out
    with open(tmp_path / "out" / "report.csv") as csv_file:
        (row,) = csv.DictReader(csv_file)
    firsts = [next(r["sim/time_s"] for r in rs if r["eval/accuracy"] >= float(f"{target}")) for rs in records]
    assert float(row["sim_seconds_to_target_mean"]) == pytest.approx(sum(firsts) / 2)
    assert row["seeds_reached_target_sim"] == "2"
    (curve,) = [report.mean_curve(runs, x="sim_time") for runs in _groups(root).values()]
    assert [t for t, *_ in curve] == sorted(r["sim/time_s"] for rs in records for r in rs)
    assert (tmp_path / "out" / "accuracy.png").read_bytes()[:8] == PNG_MAGIC


# ---------------------------------------------------------------- TensorBoard: by_sim_time/


def _events(path: Path) -> EventAccumulator:
    return EventAccumulator(str(path), size_guidance={"scalars": 0}).Reload()


def _steps(events: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(s.step, pytest.approx(s.value)) for s in events.Scalars(tag)]


ROUNDS = [  # (round, metrics) as a clocked run logs them; round 2 was not evaluated
    (1, {"train/loss": 0.9, "sim/time_s": 12.4, "sim/round_s": 12.4, "eval/loss": 2.0, "eval/accuracy": 0.25}),
    (2, {"train/loss": 0.8, "sim/time_s": 20.6, "sim/round_s": 8.2}),
    (3, {"train/loss": 0.7, "sim/time_s": 33.5, "sim/round_s": 12.9, "eval/loss": 1.5, "eval/accuracy": 0.5}),
]


def test_sim_time_scalars_are_stepped_by_whole_simulated_seconds(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(tmp_path)) as writer:
        for _, metrics in ROUNDS:
            add_sim_time_scalars(writer, metrics)
    events = _events(tmp_path)
    assert sorted(events.Tags()["scalars"]) == [
        "by_sim_time/eval/accuracy",
        "by_sim_time/eval/loss",
        "by_sim_time/train/loss",
    ]
    assert _steps(events, "by_sim_time/eval/accuracy") == [(12, 0.25), (34, 0.5)]  # int(round(33.5)) = 34
    assert _steps(events, "by_sim_time/train/loss") == [(12, 0.9), (21, 0.8), (34, 0.7)]
    assert sim_time_scalars({"sim/time_s": None, "eval/accuracy": 0.5}) == []  # a null clock: nothing
    [(tag, value, step)] = sim_time_scalars({"sim/time_s": 2.5, "eval/loss": None})  # null as in metrics.jsonl
    assert tag == "by_sim_time/eval/loss" and math.isnan(value) and step == 2  # round half to even


def test_without_a_clock_the_event_file_is_unchanged(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(tmp_path)) as writer:
        writer.add_scalar("eval/accuracy", 0.5, 1)
        writer.flush()
        (path,) = tmp_path.iterdir()
        before = path.read_bytes()
        add_sim_time_scalars(writer, {"train/loss": 0.9, "eval/loss": 1.5, "eval/accuracy": 0.5})
        writer.flush()
        assert path.read_bytes() == before


def test_a_resumed_writer_gets_the_kept_rounds_back(tmp_path: Path) -> None:
    """As RunLogger.restore: the interrupted run logged rounds 1-3, the resumed one reopens with purge_step=3
    (dropping every tag's steps >= 3, so the sim-time points at 12 and 21 s too) and continues with round 3."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(tmp_path)) as writer:
        for round_num, metrics in ROUNDS:
            writer.add_scalar("train/loss", metrics["train/loss"], round_num)
            add_sim_time_scalars(writer, metrics)
    after_existing_files(tmp_path)  # as RunLogger.restore: the new file must sort after the old one
    with SummaryWriter(log_dir=str(tmp_path), purge_step=3) as writer:
        for _, metrics in ROUNDS[:2]:
            add_sim_time_scalars(writer, metrics, first_step=3)
        again = dict(ROUNDS[2][1], **{"sim/time_s": 31.0, "train/loss": 0.6})  # round 3 redone
        writer.add_scalar("train/loss", again["train/loss"], 3)
        add_sim_time_scalars(writer, again)
    events = _events(tmp_path)
    assert _steps(events, "train/loss") == [(1, 0.9), (2, 0.8), (3, 0.6)]
    assert _steps(events, "by_sim_time/train/loss") == [(12, 0.9), (21, 0.8), (31, 0.6)]


def _log(run_dir: Path, rounds: list[tuple[int, dict[str, float]]]) -> None:
    with RunLogger(run_dir, progress=False) as logger:
        for round_num, metrics in rounds:
            logger.log_round(round_num, metrics)


def test_run_logger_without_a_clock_writes_no_sim_time_tags(tmp_path: Path) -> None:
    _log(tmp_path, [(n, {k: v for k, v in m.items() if not k.startswith("sim/")}) for n, m in ROUNDS])
    tags = _events(tmp_path / "tensorboard").Tags()["scalars"]
    assert sorted(tags) == ["eval/accuracy", "eval/loss", "train/loss"]


def test_run_logger_writes_sim_time_tags_and_keeps_them_on_resume(tmp_path: Path) -> None:
    _log(tmp_path, ROUNDS)
    events = _events(tmp_path / "tensorboard")
    assert _steps(events, "by_sim_time/eval/accuracy") == [(12, 0.25), (34, 0.5)]
    assert _steps(events, "eval/accuracy") == [(1, 0.25), (3, 0.5)]  # the round-stepped tags as before
    history = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()[:2]]
    with RunLogger(tmp_path, progress=False) as logger:
        logger.restore(history, next_round=3)
        logger.log_round(3, dict(ROUNDS[2][1], **{"sim/time_s": 31.0, "train/loss": 0.6}))
    events = _events(tmp_path / "tensorboard")
    assert _steps(events, "by_sim_time/train/loss") == [(12, 0.9), (21, 0.8), (31, 0.6)]
