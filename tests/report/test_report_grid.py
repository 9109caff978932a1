"""``python -m fedsim.report SWEEP --grid ROWS COLS`` (fedsim.report.grid) on real runs: each written by
``fedsim.cli.run.run_config`` into a sweep-like directory with ``.hydra/overrides.yaml`` as Hydra writes it; the cells
must be the mean ± std over seeds of the final values in the runs' own ``metrics.jsonl``."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedsim.report import command as report
from fedsim.report import grid as report_grid

COMMON = ["num_rounds=2", "logger=quiet", "data.num_devices=10", "clients_per_round=5"]
STRATEGIES = ["fedavg", "median"]
ATTACKS = [None, "sign_flip", "backdoor"]  # None: no attack= override (the run counts as attack=(default))
SEEDS = [0, 1]


def write_job(root: Path, num: int, overrides: list[str]) -> Path:
    """Run ``overrides`` with fedsim into ``<root>/<num>_<overrides without seed... as Hydra names them>`` and write
    ``.hydra/overrides.yaml`` as Hydra does (the overrides in command-line order, a YAML list)."""
    from fedsim.cli.run import compose, run_config

    run_dir = root / f"{num}_{','.join(sorted(overrides))}"
    run_config(compose(overrides), run_dir=run_dir)
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    return run_dir


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """strategy=fedavg,median × attack=(none given),sign_flip,backdoor × seed=0,1: 12 two-round runs, in job order."""
    root = tmp_path_factory.mktemp("grid") / "sweep"
    jobs = [
        [f"strategy={s}", *([f"attack={a}"] if a else []), f"seed={seed}", *COMMON]
        for s in STRATEGIES
        for a in ATTACKS
        for seed in SEEDS
    ]
    for num, overrides in enumerate(jobs):
        write_job(root, num, overrides)
    return root


def final(run_dir: Path, metric: str) -> float | None:
    """The last value of ``metric`` in the run's metrics.jsonl, read here independently of fedsim.report."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    values = [r[metric] for r in rows if r.get(metric) is not None]
    return values[-1] if values else None


def expected(root: Path, metric: str) -> dict[tuple[str, str], list[float]]:
    """Final values of ``metric`` per (strategy, attack) cell, from each run's own files."""
    cells: dict[tuple[str, str], list[float]] = {}
    for run_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        overrides = dict(o.split("=", 1) for o in yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()))
        value = final(run_dir, metric)
        if value is not None:
            cells.setdefault((overrides["strategy"], overrides.get("attack", "(default)")), []).append(value)
    return cells


def grid_csv(out: Path) -> list[dict[str, Any]]:
    with open(out / "grid.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_cells_are_the_mean_and_std_of_the_runs_final_values(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        report.main(
            [str(sweep), "--grid", "strategy", "attack", "--metric", "attack/backdoor_success", "--out", str(tmp_path)]
        )
        == 0
    )
    printed = capsys.readouterr().out
    rows = grid_csv(tmp_path)
    accuracy = expected(sweep, "eval/accuracy")
    assert len(accuracy) == 6 and all(len(v) == 2 for v in accuracy.values())
    by_row = {r["strategy"]: r for r in rows if r["metric"] == "eval/accuracy"}
    assert list(by_row) == STRATEGIES  # rows in job order
    for (strategy, attack), values in accuracy.items():
        mean, std = statistics.fmean(values), statistics.stdev(values)
        row = by_row[strategy]
        assert float(row[f"{attack}_mean"]) == pytest.approx(mean, rel=1e-12)
        assert float(row[f"{attack}_std"]) == pytest.approx(std, rel=1e-12, abs=1e-15)
        assert row[f"{attack}_seeds"] == "2"
        assert f"{mean:.4f} ± {std:.4f}" in printed
    # the backdoor grid: only the backdoor column (no other run logged attack/backdoor_success), said in one line
    success = expected(sweep, "attack/backdoor_success")
    assert set(success) == {(s, "backdoor") for s in STRATEGIES}
    backdoor_rows = {r["strategy"]: r for r in rows if r["metric"] == "attack/backdoor_success"}
    for (strategy, _), values in success.items():
        assert float(backdoor_rows[strategy]["backdoor_mean"]) == pytest.approx(statistics.fmean(values), rel=1e-12)
        assert backdoor_rows[strategy]["(default)_mean"] == backdoor_rows[strategy]["(default)_seeds"] == ""
    assert (
        "fedsim.report: no run logged attack/backdoor_success in column (default), column sign_flip; "
        "left out of this grid"
    ) in printed


def test_printed_and_markdown_tables_have_rows_by_columns(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert report.main([str(sweep), "--grid", "strategy", "attack", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    common = "common overrides: clients_per_round=5 data.num_devices=10 logger=quiet num_rounds=2"
    assert f"grid: strategy × attack; {common}" in printed
    lines = printed.splitlines()
    start = lines.index("final eval/accuracy, mean ± std over seeds")
    header, fedavg, median = lines[start + 1 : start + 4]
    assert header.split() == ["strategy", "\\", "attack", "(default)", "sign_flip", "backdoor"]
    assert fedavg.startswith("fedavg ") and median.startswith("median ") and fedavg.count("±") == 3
    md = (tmp_path / "grid.md").read_text().splitlines()
    assert md[0] == f"common overrides: `{common.split(': ')[1]}`"
    assert "### final eval/accuracy, mean ± std over seeds" in md
    table = md[md.index("### final eval/accuracy, mean ± std over seeds") + 2 :]
    assert table[0] == "| strategy \\ attack | (default) | sign_flip | backdoor |" and table[1] == "|---|---|---|---|"
    assert table[2].startswith("| fedavg | ") and table[3].startswith("| median | ")
    assert "wrote " + ", ".join(str(tmp_path / n) for n in ("report.csv", "grid.csv", "grid.md")) in printed


def test_runs_that_differ_in_another_override_get_separate_grids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "sweep"
    jobs = [
        ["strategy=fedavg", "attack=sign_flip", "seed=0", *COMMON],
        ["strategy=fedavg", "attack=sign_flip", "attack.fraction=0.4", "seed=0", *COMMON],
        ["strategy=median", "attack=sign_flip", "attack.fraction=0.4", "seed=0", *COMMON],
    ]
    dirs = [write_job(root, num, overrides) for num, overrides in enumerate(jobs)]
    assert (
        report.main(
            [str(root), "--grid", "strategy", "attack", "--metric", "eval/loss", "--out", str(tmp_path / "out")]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "final eval/accuracy, mean ± std over seeds [attack.fraction=(default)]" in printed
    assert "final eval/accuracy, mean ± std over seeds [attack.fraction=0.4]" in printed
    rows = grid_csv(tmp_path / "out")
    for metric in ("eval/accuracy", "eval/loss"):  # one row per run: the two fedavg runs are not averaged
        got = [
            (r["attack.fraction"], r["strategy"], float(r["sign_flip_mean"]), r["sign_flip_std"], r["sign_flip_seeds"])
            for r in rows
            if r["metric"] == metric
        ]
        assert got == [
            ("(default)", "fedavg", pytest.approx(final(dirs[0], metric), rel=1e-12), "", "1"),
            ("0.4", "fedavg", pytest.approx(final(dirs[1], metric), rel=1e-12), "", "1"),
            ("0.4", "median", pytest.approx(final(dirs[2], metric), rel=1e-12), "", "1"),
        ]
    assert final(dirs[0], "eval/loss") != final(dirs[1], "eval/loss")


@pytest.mark.parametrize(
    ("keys", "line"),
    [
        (
            ["strategy", "atack"],
            "fedsim.report: --grid: no run overrides atack (the runs' keys: attack, clients_per_round, "
            "data.num_devices, logger, num_rounds, strategy)",
        ),
        (["strategy", "strategy"], "fedsim.report: --grid needs two different keys (got strategy twice)"),
        (["seed", "attack"], "fedsim.report: --grid cannot use seed: a cell is the mean over the seeds"),
    ],
)
def test_a_grid_that_cannot_be_drawn_is_one_line_and_exit_2(
    sweep: Path, tmp_path: Path, keys: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert report.main([str(sweep), "--grid", *keys, "--out", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == line and captured.out == ""
    assert not (tmp_path / "report.csv").exists() and not (tmp_path / "grid.csv").exists()


def test_a_cell_with_fewer_seeds_says_how_many() -> None:
    grid = report_grid.Grid(
        "eval/accuracy",
        ("strategy", "attack"),
        (),
        ("a",),
        ("x", "y"),
        {("a", "x"): (0.5, 0.7), ("a", "y"): (0.25,)},
        {("a", "x"): 2, ("a", "y"): 2},
    )
    assert report_grid.cell_text(grid, ("a", "x")) == "0.6000 ± 0.1414"
    assert report_grid.cell_text(grid, ("a", "y")) == "0.2500 (n=1)"
    assert report_grid.cell_text(grid, ("b", "y")) == "-"
