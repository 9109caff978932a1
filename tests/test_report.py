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

from fedsim import report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fake_run(root: Path, name: str, accs: list[float | None], *, overrides: list[str] | None = None,
             num_rounds: int | None = None, summary: bool | dict[str, Any] = True, round_s: float = 1.0) -> Path:
    """A run dir as fedsim writes it: metrics.jsonl, summary.json and .hydra/{overrides,config}.yaml."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    records = [{"round": i + 1, "train/loss": 1.0, "eval/accuracy": acc, "eval/loss": 1.0, "time/round_s": round_s}
               for i, acc in enumerate(accs)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if overrides is not None:
        (run_dir / ".hydra").mkdir()
        (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        seed = next(o.split("=")[1] for o in overrides if o.startswith("seed="))
        config = {"seed": int(seed), "num_rounds": num_rounds or len(accs)}
        (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    if summary:
        done = [a for a in accs if a is not None]
        (run_dir / "summary.json").write_text(json.dumps(
            {"rounds": len(accs), "final_accuracy": done[-1], "best_accuracy": max(done), "wall_time_s": 10.0 * len(accs),
             **(summary if isinstance(summary, dict) else {})}))
    return run_dir


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """Config A (2 seeds, finished) and config B (1 finished seed, 1 seed 2 rounds into 3, no summary)."""
    fake_run(tmp_path, "0_seed=0,strategy=a", [0.5, 0.7, 0.6], overrides=["strategy=a", "seed=0", "num_rounds=3"])
    fake_run(tmp_path, "1_seed=1,strategy=a", [0.3, 0.5, 0.8], overrides=["seed=1", "strategy=a", "num_rounds=3"])
    fake_run(tmp_path, "2_seed=0,strategy=b", [0.4, 0.5, 0.6], overrides=["strategy=b", "seed=0", "num_rounds=3"])
    fake_run(tmp_path, "3_seed=1,strategy=b", [0.2, 0.3], overrides=["strategy=b", "seed=1", "num_rounds=3"],
             num_rounds=3, summary=False, round_s=2.5)
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
        "unfinished: 3_seed=1,strategy=b (2 rounds logged, no summary.json)"]


def test_summary_finished_flag_decides_and_old_summaries_compare_rounds(tmp_path: Path) -> None:
    fake_run(tmp_path, "0_old", [0.1, 0.2], overrides=["seed=0"], num_rounds=5)  # no "finished": 2 of 5 rounds
    fake_run(tmp_path, "1_interrupted", [0.1, 0.2], overrides=["seed=1"], num_rounds=5,
             summary={"finished": False, "stop_reason": "interrupted after round 2"})
    fake_run(tmp_path, "2_early_stop", [0.1, 0.9], overrides=["seed=2"], num_rounds=5,
             summary={"finished": True, "stop_reason": "early stop: reached target accuracy 0.8 at round 2 (0.9000)"})
    fake_run(tmp_path, "3_old_complete", [0.1, 0.2], overrides=["seed=3"])
    assert [(r.path.name, r.finished) for r in report.load_runs(tmp_path)] == [
        ("0_old", False), ("1_interrupted", False), ("2_early_stop", True), ("3_old_complete", True)]


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


def test_main_prints_table_writes_csv_and_png(sweep: Path, tmp_path_factory: pytest.TempPathFactory,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path_factory.mktemp("out")
    assert report.main([str(sweep), "--target", "0.6", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "common overrides: num_rounds=3" in text
    assert re.search(r"strategy=a\s+2/2\s+3\s+0\.7000 ± 0\.1414\s+0\.7500 ± 0\.0707\s+2\.5 \(2/2\)\s+30\.0", text)
    assert re.search(r"strategy=b\s+1/2\s+2-3\s+", text)
    rows = list(csv.DictReader(open(out / "report.csv")))
    assert [r["configuration"] for r in rows] == ["num_rounds=3,strategy=a", "num_rounds=3,strategy=b"]
    a = rows[0]
    assert (a["seeds_finished"], a["seeds_total"], a["seeds_reached_target"], a["target"]) == ("2", "2", "2", "0.6")
    assert float(a["final_accuracy_mean"]) == pytest.approx(0.7)
    assert float(a["final_accuracy_std"]) == pytest.approx(math.sqrt(0.02))
    assert float(a["rounds_to_target_mean"]) == 2.5
    assert (out / "accuracy.png").read_bytes()[:8] == PNG_MAGIC


def test_csv_without_target_has_no_target_columns_and_blank_single_seed_std(tmp_path: Path) -> None:
    fake_run(tmp_path, "only", [0.5, 0.6], overrides=["seed=0", "strategy=a"])
    assert report.main([str(tmp_path)]) == 0
    (row,) = csv.DictReader(open(tmp_path / "report.csv"))
    assert "target" not in row and row["final_accuracy_std"] == "" and row["final_accuracy_mean"] == "0.6"


def test_without_matplotlib_says_so_and_still_writes_csv(sweep: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert report.main([str(sweep)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fedsim.report:")]
    assert lines == ["fedsim.report: matplotlib is not installed (pip install 'fedsim[plot]'); skipped accuracy.png"]
    assert (sweep / "report.csv").exists() and not (sweep / "accuracy.png").exists()


@pytest.mark.parametrize("where", ["missing", "empty"])
def test_no_runs_is_one_line_and_exit_2(tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert report.main([str(tmp_path / where)]) == 2
    assert capsys.readouterr().err == f"fedsim.report: no runs (metrics.jsonl) under {tmp_path / where}\n"


def test_target_must_be_a_fraction(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        report.main([str(sweep), "--target", "60"])
    assert exit_info.value.code == 2 and "must be an accuracy in (0, 1]" in capsys.readouterr().err
