"""fedsim.report on hand-made run directories with hand-computed numbers (real Hydra sweeps: test_sweep.py)."""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedsim.report import command as report
from fedsim.report import plot as report_plot

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fake_run(
    root: Path,
    name: str,
    accs: list[float | None],
    *,
    overrides: list[str] | None = None,
    num_rounds: int | None = None,
    summary: bool | dict[str, Any] = True,
    round_s: float = 1.0,
) -> Path:
    """A run dir as fedsim writes it: metrics.jsonl, summary.json and .hydra/{overrides,config}.yaml."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    records = [
        {"round": i + 1, "train/loss": 1.0, "eval/accuracy": acc, "eval/loss": 1.0, "time/round_s": round_s}
        for i, acc in enumerate(accs)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if overrides is not None:
        (run_dir / ".hydra").mkdir()
        (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        seed = next(o.split("=")[1] for o in overrides if o.startswith("seed="))
        config = {"seed": int(seed), "num_rounds": num_rounds or len(accs)}
        (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    if summary:
        done = [a for a in accs if a is not None]
        (run_dir / "summary.json").write_text(
            json.dumps(
                {
                    "rounds": len(accs),
                    "final_accuracy": done[-1],
                    "best_accuracy": max(done),
                    "wall_time_s": 10.0 * len(accs),
                    **(summary if isinstance(summary, dict) else {}),
                }
            )
        )
    return run_dir


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """Config A (2 seeds, finished) and config B (1 finished seed, 1 seed 2 rounds into 3, no summary)."""
    fake_run(tmp_path, "0_seed=0,strategy=a", [0.5, 0.7, 0.6], overrides=["strategy=a", "seed=0", "num_rounds=3"])
    fake_run(tmp_path, "1_seed=1,strategy=a", [0.3, 0.5, 0.8], overrides=["seed=1", "strategy=a", "num_rounds=3"])
    fake_run(tmp_path, "2_seed=0,strategy=b", [0.4, 0.5, 0.6], overrides=["strategy=b", "seed=0", "num_rounds=3"])
    fake_run(
        tmp_path,
        "3_seed=1,strategy=b",
        [0.2, 0.3],
        overrides=["strategy=b", "seed=1", "num_rounds=3"],
        num_rounds=3,
        summary=False,
        round_s=2.5,
    )
    return tmp_path


def stats_by_name(root: Path, target: float | None = None) -> dict[str, report.ConfigStats]:
    groups = report.group_runs(report.load_runs(root))
    return {",".join(c): report.aggregate(c, runs, target) for c, runs in groups.items()}


# ---------------------------------------------------------------- pure functions


def test_mean_std_is_sample_std() -> None:
    mean, std = report.mean_std([0.6, 0.8])
    assert mean == pytest.approx(0.7) and std == pytest.approx(math.sqrt(0.02))
    assert report.mean_std([0.5]) == (0.5, None)
    assert report.mean_std([]) == (None, None)


def test_rounds_to_target_is_first_round_at_or_above() -> None:
    curve = [(1, 0.3), (2, 0.6), (3, 0.5), (4, 0.9)]
    assert report.rounds_to_target(curve, 0.6) == 2
    assert report.rounds_to_target(curve, 0.7) == 4
    assert report.rounds_to_target(curve, 0.95) is None


def test_split_seed_drops_seed_in_any_form_and_sorts() -> None:
    assert report.split_seed(["strategy=b", "seed=3", "num_rounds=2"]) == (("num_rounds=2", "strategy=b"), "3")
    assert report.split_seed(["+seed=1", "seeds=x"]) == (("seeds=x",), "1")


def test_labels_keep_only_what_differs() -> None:
    short, common = report.labels([("n=2", "s=a"), ("n=2", "s=b")])
    assert short == {("n=2", "s=a"): "s=a", ("n=2", "s=b"): "s=b"} and common == ["n=2"]
    short, common = report.labels([("n=2", "s=a")])
    assert short == {("n=2", "s=a"): "n=2,s=a"} and common == []


# ---------------------------------------------------------------- loading and aggregating fake sweeps


def test_seeds_grouped_and_hand_numbers(sweep: Path) -> None:
    stats = stats_by_name(sweep, target=0.6)
    assert list(stats) == ["num_rounds=3,strategy=a", "num_rounds=3,strategy=b"]
    a = stats["num_rounds=3,strategy=a"]
    assert (a.finished, a.total, a.rounds) == (2, 2, (3, 3))
    assert a.final[0] == pytest.approx(0.7) and a.final[1] == pytest.approx(math.sqrt(0.02))  # finals 0.6, 0.8
    assert a.best[0] == pytest.approx(0.75) and a.best[1] == pytest.approx(math.sqrt(0.005))  # bests 0.7, 0.8
    assert (a.to_target, a.reached) == (2.5, 2)  # rounds 2 and 3
    assert a.wall_time_s == pytest.approx(30.0)  # summary.json wall_time_s


def test_rounds_to_target_counts_only_seeds_that_reached_it(sweep: Path) -> None:
    a = stats_by_name(sweep, target=0.75)["num_rounds=3,strategy=a"]
    assert (a.to_target, a.reached) == (3, 1)
    b = stats_by_name(sweep, target=0.9)["num_rounds=3,strategy=b"]
    assert (b.to_target, b.reached) == (None, 0)


def test_unfinished_run_included_and_marked(sweep: Path) -> None:
    runs = {r.path.name: r for r in report.load_runs(sweep)}
    partial = runs["3_seed=1,strategy=b"]
    assert not partial.finished and partial.rounds == 2 and partial.seed == "1"
    assert partial.wall_time_s == pytest.approx(5.0)  # no summary.json: sum of time/round_s
    b = stats_by_name(sweep)["num_rounds=3,strategy=b"]
    assert (b.finished, b.total, b.rounds) == (1, 2, (2, 3))
    assert b.final[0] == pytest.approx(0.45)  # 0.6 and the partial run's latest 0.3
    assert report.unfinished_lines(list(runs.values()), sweep) == [
        "unfinished: 3_seed=1,strategy=b (2 rounds logged, no summary.json)"
    ]


def test_summary_finished_flag_decides_and_old_summaries_compare_rounds(tmp_path: Path) -> None:
    fake_run(tmp_path, "0_old", [0.1, 0.2], overrides=["seed=0"], num_rounds=5)  # no "finished": 2 of 5 rounds
    fake_run(
        tmp_path,
        "1_interrupted",
        [0.1, 0.2],
        overrides=["seed=1"],
        num_rounds=5,
        summary={"finished": False, "stop_reason": "interrupted after round 2"},
    )
    fake_run(
        tmp_path,
        "2_early_stop",
        [0.1, 0.9],
        overrides=["seed=2"],
        num_rounds=5,
        summary={"finished": True, "stop_reason": "early stop: reached target accuracy 0.8 at round 2 (0.9000)"},
    )
    fake_run(tmp_path, "3_old_complete", [0.1, 0.2], overrides=["seed=3"])
    assert [(r.path.name, r.finished) for r in report.load_runs(tmp_path)] == [
        ("0_old", False),
        ("1_interrupted", False),
        ("2_early_stop", True),
        ("3_old_complete", True),
    ]


def test_half_written_line_and_unevaluated_rounds_are_skipped(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, "r", [None, 0.4, None, 0.5], overrides=["seed=0"])
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"round": 5, "eval/accu')
    (run,) = report.load_runs(tmp_path)
    assert run.curve == ((2, 0.4), (4, 0.5)) and run.rounds == 4


def test_dir_names_stand_in_for_missing_overrides_yaml(tmp_path: Path) -> None:
    for num, seed in ((2, 0), (10, 1)):
        fake_run(tmp_path, f"{num}_seed={seed},strategy=x", [0.5])
    runs = report.load_runs(tmp_path)
    assert [r.path.name for r in runs] == ["2_seed=0,strategy=x", "10_seed=1,strategy=x"]  # job order
    assert {r.config for r in runs} == {("strategy=x",)} and [r.seed for r in runs] == ["0", "1"]


def test_mean_curve_averages_seeds_present_at_each_round(sweep: Path) -> None:
    groups = report.group_runs(report.load_runs(sweep))
    curve = report.mean_curve(groups[("num_rounds=3", "strategy=b")])
    expected = [(1, 0.3, 0.2, 0.4), (2, 0.4, 0.3, 0.5), (3, 0.6, 0.6, 0.6)]
    for got, want in zip(curve, expected, strict=True):
        assert got == pytest.approx(want)


# ---------------------------------------------------------------- command line on fake sweeps


def test_main_prints_table_writes_csv_and_png(
    sweep: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path_factory.mktemp("out")
    assert report.main([str(sweep), "--target", "0.6", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "common overrides: num_rounds=3" in text
    assert re.search(r"strategy=a\s+2/2\s+3\s+0\.7000 ± 0\.1414\s+0\.7500 ± 0\.0707\s+2\.5 \(2/2\)\s+30\.0", text)
    assert re.search(r"strategy=b\s+1/2\s+2-3\s+", text)
    with open(out / "report.csv") as csv_file:
        rows = list(csv.DictReader(csv_file))
    assert [r["configuration"] for r in rows] == [
        "strategy=a,num_rounds=3",
        "strategy=b,num_rounds=3",
    ]  # differing first
    a = rows[0]
    assert (a["seeds_finished"], a["seeds_total"], a["seeds_reached_target"], a["target"]) == ("2", "2", "2", "0.6")
    assert float(a["final_accuracy_mean"]) == pytest.approx(0.7)
    assert float(a["final_accuracy_std"]) == pytest.approx(math.sqrt(0.02))
    assert float(a["rounds_to_target_mean"]) == 2.5
    assert (out / "accuracy.png").read_bytes()[:8] == PNG_MAGIC


def test_csv_without_target_has_no_target_columns_and_blank_single_seed_std(tmp_path: Path) -> None:
    fake_run(tmp_path, "only", [0.5, 0.6], overrides=["seed=0", "strategy=a"])
    assert report.main([str(tmp_path)]) == 0
    with open(tmp_path / "report.csv") as csv_file:
        (row,) = csv.DictReader(csv_file)
    assert "target" not in row and row["final_accuracy_std"] == "" and row["final_accuracy_mean"] == "0.6"


def test_without_matplotlib_says_so_and_still_writes_csv(
    sweep: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert report.main([str(sweep)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fedsim.report:")]
    assert lines == [
        "fedsim.report: matplotlib is not installed (pip install 'fedsim-torch[plot]', in a source checkout "
        "pip install -e '.[plot]', or pip install matplotlib); skipped accuracy.png"
    ]
    assert (sweep / "report.csv").exists() and not (sweep / "accuracy.png").exists()


@pytest.mark.parametrize("where", ["missing", "empty"])
def test_no_runs_is_one_line_and_exit_2(tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert report.main([str(tmp_path / where)]) == 2
    assert (
        capsys.readouterr().err == f"fedsim.report: no runs (metrics.jsonl or summary.json) under {tmp_path / where}\n"
    )


def test_target_must_be_a_fraction(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        report.main([str(sweep), "--target", "60"])
    assert exit_info.value.code == 2 and "must be an accuracy in (0, 1]" in capsys.readouterr().err


def test_a_fallback_list_gives_each_run_the_first_scalar_it_logged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    personal = fake_run(tmp_path, "0_seed=0,strategy=p", [0.5, 0.6], overrides=["seed=0", "strategy=p"])
    fake_run(tmp_path, "1_seed=0,strategy=g", [0.4, 0.7], overrides=["seed=0", "strategy=g"])
    records = [json.loads(line) for line in (personal / "metrics.jsonl").read_text().splitlines()]
    for record, value in zip(records, [0.8, 0.9], strict=True):
        record["eval_personal/accuracy_mean"] = value  # only the personalised run logs it
    (personal / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    name = "eval_personal/accuracy_mean,eval/accuracy"
    runs = report.load_runs(tmp_path)
    assert [report.metric_value(r, name) for r in runs] == [0.9, 0.7]  # p's personal mean, g's test accuracy
    assert [report.metric_value(r, name + ":mean") for r in report.load_runs(tmp_path, series=name.split(","))] == [
        pytest.approx(0.85),
        pytest.approx(0.55),
    ]
    assert [report.metric_value(r, "fit/none,eval/none") for r in runs] == [None, None]
    with pytest.raises(SystemExit) as exit_info:
        report.main([str(tmp_path), "--metric", "eval/accuracy,not a name"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "or a list such as" in err


# ---------------------------------------------------------------- damaged metrics.jsonl: cut mid-line, foreign lines

FINISHED = {"finished": True, "stop_reason": "completed"}


@pytest.fixture
def damaged(tmp_path: Path) -> Path:
    """Config a: seed 0 intact; seed 1 cut in the middle of its round-3 line, though its summary.json says it
    finished 3 rounds (the file was damaged afterwards). Config b: seed 0 with a line that is not JSON (line 3) and
    a foreign JSON line (line 5) that, read as a record, would be round 9 at accuracy 0.99; seed 1 intact."""
    a = ["strategy=a", "num_rounds=3"]
    fake_run(tmp_path, "0_seed=0,strategy=a", [0.5, 0.7, 0.6], overrides=[*a, "seed=0"], summary=FINISHED)
    cut = fake_run(tmp_path, "1_seed=1,strategy=a", [0.3, 0.5, 0.8], overrides=[*a, "seed=1"], summary=FINISHED)
    lines = (cut / "metrics.jsonl").read_text().splitlines(keepends=True)
    (cut / "metrics.jsonl").write_text("".join(lines[:2]) + lines[2][:25])  # '{"round": 3, "train/loss"'
    b = ["strategy=b", "num_rounds=3"]
    foreign = fake_run(tmp_path, "2_seed=0,strategy=b", [0.4, 0.6, 0.7], overrides=[*b, "seed=0"], summary=FINISHED)
    lines = (foreign / "metrics.jsonl").read_text().splitlines(keepends=True)
    other = json.dumps({"round": 9, "eval/accuracy": 0.99, "source": "another tool"}) + "\n"
    (foreign / "metrics.jsonl").write_text("".join([*lines[:2], "<<<<<<< HEAD\n", lines[2], other]))
    fake_run(tmp_path, "3_seed=1,strategy=b", [0.2, 0.5, 0.9], overrides=[*b, "seed=1"], summary=FINISHED)
    return tmp_path


CUT_NOTE = (
    "fedsim.report: 1_seed=1,strategy=a/metrics.jsonl is damaged: skipped 1 of 3 lines (line 3: cut short); "
    "read the run from the other 2; not counted as finished: its last round (3) is not among them"
)
FOREIGN_NOTE = (
    "fedsim.report: 2_seed=0,strategy=b/metrics.jsonl is damaged: skipped 2 of 5 lines (line 3: not JSON; "
    "line 5: not a round record); read the run from the other 3"
)


def test_damaged_runs_are_read_from_their_usable_rows(damaged: Path) -> None:
    runs = {r.path.name: r for r in report.load_runs(damaged)}
    cut, foreign = runs["1_seed=1,strategy=a"], runs["2_seed=0,strategy=b"]
    assert cut.skipped == ((3, "cut short"),) and cut.lines == 3
    assert cut.curve == ((1, 0.3), (2, 0.5)) and cut.rounds == 2 and not cut.finished  # round 3, its last, is cut
    assert foreign.skipped == ((3, "not JSON"), (5, "not a round record")) and foreign.lines == 5
    assert foreign.curve == ((1, 0.4), (2, 0.6), (3, 0.7)) and foreign.rounds == 3 and foreign.finished
    assert not runs["0_seed=0,strategy=a"].damaged and not runs["3_seed=1,strategy=b"].damaged
    stats = stats_by_name(damaged)
    a, b = stats["num_rounds=3,strategy=a"], stats["num_rounds=3,strategy=b"]
    assert (a.finished, a.total, a.rounds) == (1, 2, (2, 3))
    assert a.final[0] == pytest.approx(0.55) and a.final[1] == pytest.approx(math.sqrt(0.005))  # finals 0.6, 0.5
    assert a.best[0] == pytest.approx(0.6) and a.best[1] == pytest.approx(math.sqrt(0.02))  # bests 0.7, 0.5
    assert a.damaged == ("seed=1: 1 line skipped, not counted as finished",)
    assert (b.finished, b.total, b.rounds) == (2, 2, (3, 3))
    assert b.final[0] == pytest.approx(0.8) and b.final[1] == pytest.approx(math.sqrt(0.02))  # finals 0.7, 0.9
    assert b.best[0] == pytest.approx(0.8)  # bests 0.7, 0.9: the foreign line's 0.99 is not read
    assert b.damaged == ("seed=0: 2 lines skipped",)


def test_damaged_file_named_in_one_note_and_marked_in_table_and_csv(
    damaged: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path_factory.mktemp("out")
    assert report.main([str(damaged), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if line.startswith("fedsim.report:")] == [CUT_NOTE, FOREIGN_NOTE]
    assert "unfinished: 1_seed=1,strategy=a (2 rounds logged)" in lines
    assert lines[1].split()[:4] == ["configuration", "seeds", "damaged", "rounds"]
    assert re.match(r"strategy=a\s+1/2\s+1\s+2-3\s+0\.5500 ± 0\.0707\s+0\.6000 ± 0\.1414\s", lines[2])
    assert re.match(r"strategy=b\s+2/2\s+1\s+3\s+0\.8000 ± 0\.1414\s+0\.8000 ± 0\.1414\s", lines[3])
    with open(out / "report.csv") as csv_file:
        rows = list(csv.DictReader(csv_file))
    assert list(rows[0])[:5] == ["configuration", "seeds_finished", "seeds_total", "seeds_damaged", "damaged"]
    assert [(r["seeds_finished"], r["seeds_total"], r["seeds_damaged"]) for r in rows] == [
        ("1", "2", "1"),
        ("2", "2", "1"),
    ]
    assert [r["damaged"] for r in rows] == [
        "seed=1: 1 line skipped, not counted as finished",
        "seed=0: 2 lines skipped",
    ]
    assert [float(r["final_accuracy_mean"]) for r in rows] == pytest.approx([0.55, 0.8])
    assert "status" not in rows[0]  # no run failed


def test_foreign_file_with_no_round_record(tmp_path: Path) -> None:
    run_dir = tmp_path / "x"
    run_dir.mkdir()
    lines = [json.dumps({"step": i, "loss": 1.0}) for i in range(4)] + [json.dumps({"round": 1, "note": "x"})]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n\n")  # and a blank line: passed over
    (run,) = report.load_runs(tmp_path)
    assert (run.rounds, run.curve, run.finished, run.lines) == (0, (), False, 5)
    assert report.damaged_lines([run], tmp_path) == [
        "fedsim.report: x/metrics.jsonl is damaged: skipped 5 of 5 lines (lines 1, 2, 3 and 2 more: not a round "
        "record); no line is left to read the run from"
    ]


@pytest.mark.parametrize(
    ("line", "is_record"),
    [
        ({"round": 1, "eval/accuracy": 0.5, "eval/loss": None, "client/num_sampled": 3}, True),
        ({"round": 2, "clients": [{"client_id": 4, "worker": "serial", "epoch_losses": [0.1]}]}, True),
        ({"round": 1.0}, False),
        ({"round": True}, False),
        ({"round": -1}, False),
        ({"eval/accuracy": 0.5}, False),
        ({"round": 1, "eval/accuracy": "0.5"}, False),
        ({"round": 1, "flag": True}, False),
        ({"round": 1, "clients": [{"id": 4}]}, False),
        ({"round": 1, "clients": {"client_id": 4}}, False),
        ([1, 2], False),
    ],
)
def test_what_counts_as_a_round_record(line: Any, is_record: bool) -> None:
    from fedsim.report.runs import is_round_record

    assert is_round_record(line) is is_record


# ---------------------------------------------------------------- realistic sweep: 11 overrides, 2 differ; a failed job

SHARED = [
    "num_rounds=3",
    "data.num_devices=10",
    "clients_per_round=3",
    "executor=serial",
    "logger=quiet",
    "client.epochs=2",
    "client.batch_size=20",
    "data.alpha=0.5",
    "data.beta=0.5",
]  # + strategy, lr: 11
STRATEGIES, LRS = ("fedavg", "fedprox"), ("0.05", "0.1")


def metrics_row(round_num: int, acc: float, round_s: float) -> dict[str, Any]:
    """One metrics.jsonl record with the fields a real serial run logs (copied from one)."""
    return {
        "round": round_num,
        "train/loss": 0.9,
        "client/num_sampled": 3.0,
        "client/num_failed": 0.0,
        "client/num_examples": 384.0,
        "client/num_rejected": 0.0,
        "client/num_aggregated": 3.0,
        "eval/loss": 2.0 - acc,
        "eval/accuracy": acc,
        "eval_global/loss": 0.97,
        "eval_global/accuracy": 0.76,
        "time/eval_s": 0.15,
        "time/fit_s": round_s - 0.15,
        "time/round_s": round_s,
        "system/rss_mb": 682.8,
        "clients": [
            {
                "client_id": 0,
                "num_examples": 77,
                "train_loss": 0.37,
                "update_norm": 0.65,
                "epoch_losses": [0.7, 0.04],
                "worker": "serial",
                "device": "cpu",
            }
        ],
    }


def hydra_job(
    root: Path, num: int, overrides: list[str], accs: list[float], *, round_s: float = 0.5, error: str | None = None
) -> Path:
    """A job dir as a Hydra multirun of fedsim leaves it: ``<num>_<sorted overrides>`` with ``.hydra/overrides.yaml``
    (command-line order), ``.hydra/config.yaml``, metrics.jsonl (none before the first round) and summary.json
    as ``fedsim.cli.run_summary.record_summary`` writes it (``error``: ``finished`` false, ``stop_reason``
    ``error: ...``)."""
    run_dir = root / f"{num}_{','.join(sorted(o for o in overrides))}"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides, default_flow_style=False))
    seed = int(next(o.split("=")[1] for o in overrides if o.startswith("seed=")))
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "num_rounds": 3}, sort_keys=False))
    if accs:
        rows = [metrics_row(i + 1, acc, round_s) for i, acc in enumerate(accs)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {
        "rounds": len(accs),
        "final_accuracy": accs[-1] if accs else None,
        "final_loss": 2.0 - accs[-1] if accs else None,
        "best_accuracy": max(accs) if accs else None,
        "wall_time_s": round_s * len(accs) + 0.5,
        "finished": error is None,
        "stop_reason": f"error: {error}" if error else "completed",
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return run_dir


@pytest.fixture
def realistic(tmp_path: Path) -> Path:
    """2 strategies × 2 learning rates × 2 seeds with 9 more shared overrides; the last configuration has a third
    seed that failed before its first round (summary.json only) and a fourth that failed in round 2."""
    root, num = tmp_path / "sweep", 0
    for strategy in STRATEGIES:
        for lr in LRS:
            for seed in (0, 1):
                accs = [0.3 + 0.1 * seed, 0.5 + float(lr), 0.6 + float(lr) + 0.05 * seed]
                hydra_job(
                    root,
                    num,
                    [f"strategy={strategy}", f"client.optimizer.lr={lr}", f"seed={seed}", *SHARED],
                    accs,
                    round_s=0.2 if strategy == "fedavg" else 0.4,
                )
                num += 1
    last = [f"strategy={STRATEGIES[-1]}", f"client.optimizer.lr={LRS[-1]}"]
    hydra_job(root, num, [*last, "seed=2", *SHARED], [], error="round 1 failed: 3 of 3 clients failed (client 4: boom)")
    hydra_job(root, num + 1, [*last, "seed=3", *SHARED], [0.4], error="RuntimeError: CUDA out of memory")
    return root


def test_realistic_labels_name_only_the_two_differing_overrides(realistic: Path) -> None:
    configs = list(report.group_runs(report.load_runs(realistic)))
    assert len(configs) == 4 and all(len(c) == 11 for c in configs)
    table, common = report.labels(configs)
    assert common == sorted(SHARED)
    assert list(table.values()) == [f"client.optimizer.lr={lr},strategy={s}" for s in STRATEGIES for lr in LRS]
    legend = report_plot.legend_labels(configs)
    assert list(legend.values()) == [f"lr={lr}, strategy={s}" for s in STRATEGIES for lr in LRS]


def test_legend_keys_shortened_only_while_unique_and_long_values_cut() -> None:
    assert report_plot.short_keys(["client.optimizer.lr", "server.optimizer.lr", "strategy.mu", "+x.y"]) == {
        "client.optimizer.lr": "client.optimizer.lr",
        "server.optimizer.lr": "server.optimizer.lr",
        "strategy.mu": "mu",
        "+x.y": "y",
    }
    long_a, long_b = "data.root=/very/long/path/to/the/dataset/a", "data.root=/very/long/path/to/the/dataset/b"
    names = report_plot.legend_labels([("n=1", long_a), ("n=1", long_b)])
    assert list(names.values()) == ["root=/very/long/…he/dataset/a", "root=/very/long/…he/dataset/b"]
    assert max(len(n) for n in names.values()) < len(long_a)
    same = report_plot.legend_labels([("a.k=" + "x" * 30 + "1",), ("b.k=" + "x" * 30 + "1",)])  # cut alike: full names
    assert len(set(same.values())) == 2


def _draw(groups: dict[tuple[str, ...], list[report.Run]], **kwargs: Any) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = report_plot.draw(groups, **kwargs)
    assert fig is not None
    FigureCanvasAgg(fig).draw()
    return fig, fig.canvas.get_renderer()


def _in_view(ax: Any, text: Any) -> bool:
    """False for the label of a tick outside the axes' limits (matplotlib keeps it, but does not draw it)."""
    if text in ax.get_xticklabels():
        return min(ax.get_xlim()) <= text.get_position()[0] <= max(ax.get_xlim())
    if text in ax.get_yticklabels():
        return min(ax.get_ylim()) <= text.get_position()[1] <= max(ax.get_ylim())
    return True


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.mark.parametrize("num_configs", [1, 4, 20])
def test_legend_outside_axes_and_every_text_inside_the_saved_png(tmp_path: Path, num_configs: int) -> None:
    from matplotlib.text import Text

    root = tmp_path / "sweep"
    for i in range(num_configs):
        for seed in (0, 1):
            hydra_job(
                root,
                2 * i + seed,
                [f"strategy=s{i % 5}", f"client.optimizer.lr=0.{i // 5 + 1}", f"seed={seed}", *SHARED],
                [0.1 * seed + 0.01 * i, 0.5, 0.6 + 0.01 * i],
            )
    groups = report.group_runs(report.load_runs(root))
    assert len(groups) == num_configs
    fig, renderer = _draw(groups, target=0.55)
    (ax,) = fig.axes
    legend, axes_box = ax.get_legend(), ax.get_window_extent(renderer)
    assert len(legend.get_texts()) == num_configs + 1  # + the target line
    assert legend.get_window_extent(renderer).x0 > axes_box.x1  # right of the axes: covers no curve
    pad = 0.1
    saved = fig.get_tightbbox(renderer).padded(pad).transformed(fig.dpi_scale_trans)  # what bbox_inches="tight" keeps
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and _in_view(ax, t)]
    assert texts
    for text in texts:
        box = text.get_window_extent(renderer)
        assert saved.x0 <= box.x0 and box.x1 <= saved.x1 and saved.y0 <= box.y0 and box.y1 <= saved.y1, text
    footnotes = [t for t in texts if t.get_text().startswith(("common overrides:", "overrides:"))]
    (note,) = footnotes  # the 9 shared overrides (or a single configuration's 11), wrapped to within the figure
    assert note.get_text().count("\n") >= 1
    assert note.get_window_extent(renderer).x1 <= axes_box.x1 < legend.get_window_extent(renderer).x0  # clear of it
    path = tmp_path / "accuracy.png"
    assert report_plot.plot_metric(groups, path, target=0.55)
    width, height = _png_size(path)
    assert (width, height) == pytest.approx((saved.width, saved.height), abs=2)
    assert width < 1.6 * fig.bbox.width and height < 1.6 * fig.bbox.height  # grown for the legend, not sprawling


def test_failed_jobs_listed_with_their_reason(realistic: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main([str(realistic), "--out", str(realistic / "out")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:4] == ["configuration", "seeds", "failed", "rounds"]
    assert re.match(r"client\.optimizer\.lr=0\.1,strategy=fedprox\s+2/4\s+2\s+0-3\s", lines[5])
    failed = [line for line in lines if line.startswith("failed: ")]
    assert failed == [
        f"failed: {next(realistic.glob('8_*')).name} (0 rounds logged): error: round 1 failed: 3 of 3 "
        "clients failed (client 4: boom)",
        f"failed: {next(realistic.glob('9_*')).name} (1 rounds logged): error: RuntimeError: CUDA out of memory",
    ]
    with open(realistic / "out" / "report.csv") as csv_file:
        rows = list(csv.DictReader(csv_file))
    assert [r["status"] for r in rows] == ["finished", "finished", "finished", "failed"]
    assert [r["seeds_failed"] for r in rows] == ["0", "0", "0", "2"]
    assert rows[3]["failures"] == (
        "seed=2: error: round 1 failed: 3 of 3 clients failed (client 4: boom); "
        "seed=3: error: RuntimeError: CUDA out of memory"
    )
    assert (rows[3]["seeds_finished"], rows[3]["seeds_total"]) == ("2", "4")


def test_any_metric_plotted_one_png_each_against_rounds_or_wall_time(
    realistic: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = realistic / "out"
    argv = [
        str(realistic),
        "--out",
        str(out),
        "--plot",
        "eval/loss",
        "--plot",
        "eval/accuracy",
        "--plot",
        "fit/nothing",
    ]
    assert report.main([*argv, "--x", "wall_time"]) == 0
    text = capsys.readouterr().out
    assert "fedsim.report: no run logged fit/nothing with time/round_s; skipped fit_nothing.png" in text
    assert text.splitlines()[-1] == f"wrote {out / 'report.csv'}, {out / 'eval_loss.png'}, {out / 'accuracy.png'}"
    assert _png_size(out / "eval_loss.png")[0] > 100
    runs = report.load_runs(realistic, series=["eval/loss", "time/round_s"])
    fedavg = report.group_runs(runs)[tuple(sorted(["client.optimizer.lr=0.05", "strategy=fedavg", *SHARED]))]
    assert [v for point in report.mean_curve(fedavg, "eval/loss", "wall_time") for v in point] == pytest.approx(
        [0.2, 1.65, 1.6, 1.7, 0.4, 1.45, 1.45, 1.45, 0.6, 1.325, 1.3, 1.35]
    )
    assert [x for x, *_ in report.mean_curve(fedavg)] == [1, 2, 3]
    fig, _ = _draw(report.group_runs(runs), metric="eval/loss", x="wall_time", target=0.5)
    assert fig.axes[0].get_xlabel() == "wall time, s (mean over seeds)" and fig.axes[0].get_ylabel() == "eval/loss"
    assert "target" not in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]  # only on accuracy
