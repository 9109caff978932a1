"""Accuracy against megabytes sent (issue #19): ``fedsim.report --x comm_mb`` and the "MB to target" column, on real
runs (``fedsim.cli.run.run_config``) read back from their ``metrics.jsonl``; runs written before fedsim counted
bytes."""

from __future__ import annotations

import csv
import json
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

from fedsim.report import command as report
from fedsim.report import plot as report_plot

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# the default experiment: logistic regression on Synthetic(1,1), 60 features, 10 classes: 610 float32 weights;
# 10 clients a round each download them (2,440 bytes) and upload an update (fp16: 1,220 bytes; none: 2,440)
ROUND_MB = {"fp16": 10 * (2440 + 1220) / 1e6, "none": 10 * (2440 + 2440) / 1e6}
RUNS = [("fp16", 0), ("fp16", 1), ("none", 0)]  # (compression, seed)


def _dir(compression: str, seed: int) -> str:
    """A sweep job's directory name: the report reads the overrides from it (no .hydra/ without Hydra)."""
    return f"{RUNS.index((compression, seed))}_compression={compression},seed={seed}"


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three real 3-round runs: fp16 updates with seeds 0 and 1, float32 with seed 0."""
    from fedsim.cli.run import compose, run_config

    root = tmp_path_factory.mktemp("comm") / "sweep"
    for compression, seed in RUNS:
        run_config(
            compose(["num_rounds=3", "logger=quiet", f"compression={compression}", f"seed={seed}"]),
            run_dir=root / _dir(compression, seed),
        )
    return root


def _first_at(records: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    return next((r for r in records if r.get("eval/accuracy") is not None and r["eval/accuracy"] >= target), None)


def _target(run_dirs: list[Path]) -> float:
    """An accuracy every run reaches: just below the lowest of the runs' best (the table prints targets with :g)."""
    best = min(max(r["eval/accuracy"] for r in _records(run_dir)) for run_dir in run_dirs)
    return float(f"{best:g}") - 1e-6


def _report(root: Path, out: Path, *args: str) -> None:
    assert report.main([str(root), "--out", str(out), *args]) == 0


# ---------------------------------------------------------------- what the runs logged


def test_the_runs_count_their_bytes_as_computed_by_hand(sweep: Path) -> None:
    for compression, seed in RUNS:
        records = _records(sweep / _dir(compression, seed))
        assert [r["comm/mb_total"] for r in records] == pytest.approx([n * ROUND_MB[compression] for n in (1, 2, 3)])
        run = next(r for r in report.load_runs(sweep) if r.path.name == _dir(compression, seed))
        assert run.comm_mb == tuple((r["round"], r["comm/mb_total"]) for r in records)


# ---------------------------------------------------------------- MB to target: table and report.csv


def test_mb_to_target_is_comm_mb_total_at_the_first_round_reaching_it(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = _target([sweep / _dir(*run) for run in RUNS])
    _report(sweep, tmp_path, "--target", f"{target}")
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("configuration"))
    assert re.search(rf"rounds to {target:g}\s+MB to {target:g}\s+wall s$", header)  # no clock: no sim s column
    with open(tmp_path / "report.csv") as csv_file:
        rows = {r["configuration"]: r for r in csv.DictReader(csv_file)}
    for compression in ("fp16", "none"):
        firsts = [_first_at(_records(sweep / _dir(c, s)), target) for c, s in RUNS if c == compression]
        assert all(firsts)  # the target is one every run reaches
        mb = [r["comm/mb_total"] for r in firsts]
        row = rows[f"compression={compression}"]
        assert float(row["mb_to_target_mean"]) == pytest.approx(statistics.fmean(mb), rel=1e-12)
        if len(mb) == 1:
            assert row["mb_to_target_std"] == ""
        else:
            assert float(row["mb_to_target_std"]) == pytest.approx(statistics.stdev(mb), rel=1e-12, abs=1e-15)
        assert row["seeds_reached_target_mb"] == str(len(mb)) == row["seeds_reached_target"]
        assert float(row["rounds_to_target_mean"]) == statistics.fmean(r["round"] for r in firsts)
        line = next(line for line in lines if line.startswith(f"compression={compression} "))
        mean = f"{statistics.fmean(mb):#.3g}"  # 3 significant digits (MB < 1 here: no exponent), the std alike
        cell = mean + (f" ± {statistics.stdev(mb):.{len(mean.split('.')[1])}f}" if len(mb) > 1 else "")
        assert re.search(rf"\s{re.escape(cell)} \({len(mb)}/{len(mb)}\)\s+\d+\.\d$", line), (cell, line)


def test_seeds_that_miss_the_target_are_counted_not_averaged(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fp16 = [_records(sweep / _dir("fp16", s)) for s in (0, 1)]
    top = max(r["eval/accuracy"] for rs in fp16 for r in rs)  # only the seed that logged it reaches it
    target = float(f"{top:g}") - 1e-6
    _report(sweep, tmp_path, "--target", f"{target}")
    hits = [first["comm/mb_total"] for rs in fp16 if (first := _first_at(rs, target)) is not None]
    assert len(hits) == 1
    with open(tmp_path / "report.csv") as csv_file:
        (row,) = [r for r in csv.DictReader(csv_file) if r["configuration"] == "compression=fp16"]
    assert (float(row["mb_to_target_mean"]), row["mb_to_target_std"], row["seeds_reached_target_mb"]) == (
        hits[0],
        "",
        "1",
    )
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("compression=fp16 "))
    assert re.search(rf"\s{hits[0]:#.3g} \(1/2\)\s+\d+\.\d$", line)
    _report(sweep, tmp_path, "--target", "1")  # nobody reaches 100 %
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("compression=fp16 "))
    assert re.search(r"\s- \(0/2\)\s+- \(0/2\)\s+\d+\.\d$", line)  # rounds, then MB


def test_clocked_runs_get_sim_s_then_mb(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedsim.cli.run import compose, run_config

    run_dir = tmp_path / "sweep" / "0_compression=qsgd,seed=0"
    run_config(
        compose(
            [
                "num_rounds=2",
                "logger=quiet",
                "compression=qsgd",
                "clock=sampled",
                "data.num_devices=10",
                "clients_per_round=3",
            ]
        ),
        run_dir=run_dir,
    )
    records = _records(run_dir)
    target = float(f"{records[0]['eval/accuracy']:g}") - 1e-6  # reached in round 1
    _report(tmp_path / "sweep", tmp_path / "out", "--target", f"{target}")
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("configuration"))
    assert re.search(rf"rounds to {target:g}\s+sim s to {target:g}\s+MB to {target:g}\s+wall s$", header)
    with open(tmp_path / "out" / "report.csv") as csv_file:
        (row,) = csv.DictReader(csv_file)
    assert float(row["sim_seconds_to_target_mean"]) == records[0]["sim/time_s"]
    # 3 clients download 610 float32 weights and upload QSGD, 8 bits: 610 bytes of levels and a float32 norm for
    # each of the 2 buckets of 512 values
    assert (
        float(row["mb_to_target_mean"]) == records[0]["comm/mb_total"] == pytest.approx(3 * (2440 + 610 + 2 * 4) / 1e6)
    )


# ---------------------------------------------------------------- runs written before fedsim counted bytes


def _strip_comm(run_dir: Path) -> None:
    """Make a real run look like one written before the comm/ metrics existed."""
    records = [{k: v for k, v in r.items() if not k.startswith("comm/")} for r in _records(run_dir)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def mixed(sweep: Path, tmp_path: Path) -> Path:
    """The sweep's fp16 seed 0 as it is, and its float32 run as an older fedsim wrote it."""
    import shutil

    root = tmp_path / "mixed"
    for run in (("fp16", 0), ("none", 0)):
        shutil.copytree(sweep / _dir(*run), root / _dir(*run))
    _strip_comm(root / _dir("none", 0))
    return root


def test_old_runs_report_without_mb(mixed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = _target([mixed / _dir(*run) for run in (("fp16", 0), ("none", 0))])
    _report(mixed, tmp_path, "--target", f"{target}")
    lines = capsys.readouterr().out.splitlines()
    old = next(line for line in lines if line.startswith("compression=none "))
    assert re.search(r"\s- \(no bytes\)\s+\d+\.\d$", old)
    with open(tmp_path / "report.csv") as csv_file:
        rows = {r["configuration"]: r for r in csv.DictReader(csv_file)}
    assert (rows["compression=none"]["mb_to_target_mean"], rows["compression=none"]["seeds_reached_target_mb"]) == (
        "",
        "0",
    )
    first = _first_at(_records(mixed / _dir("fp16", 0)), target)
    assert first is not None and float(rows["compression=fp16"]["mb_to_target_mean"]) == first["comm/mb_total"]
    # only old runs: no MB column, no MB fields, as before
    _report(mixed / _dir("none", 0), tmp_path, "--target", f"{target}")
    assert " MB " not in capsys.readouterr().out
    with open(tmp_path / "report.csv") as csv_file:
        (row,) = csv.DictReader(csv_file)
    assert not [name for name in row if "mb" in name]


def test_x_comm_mb_leaves_out_old_runs_and_says_so(
    mixed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _report(mixed, tmp_path, "--x", "comm_mb")
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fedsim.report:")]
    assert notes == [
        f"fedsim.report: {_dir('none', 0)} logged no comm/mb_total (written before fedsim counted bytes); "
        "left out of the comm_mb plots"
    ]
    assert (tmp_path / "accuracy.png").read_bytes()[:8] == PNG_MAGIC
    _report(mixed / _dir("none", 0), tmp_path / "old", "--x", "comm_mb")
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fedsim.report:")]
    assert notes == [
        "fedsim.report: no run logged comm/mb_total (runs written before fedsim counted bytes); nothing to "
        "plot against comm_mb",
        "fedsim.report: no run logged eval/accuracy with comm/mb_total; skipped accuracy.png",
    ]
    assert not (tmp_path / "old" / "accuracy.png").exists()


# ---------------------------------------------------------------- --x comm_mb


def test_x_comm_mb_plots_the_seeds_mean_against_megabytes(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _report(sweep, tmp_path, "--x", "comm_mb", "--plot", "eval/accuracy", "--plot", "eval/loss")
    text = capsys.readouterr().out
    assert not [line for line in text.splitlines() if line.startswith("fedsim.report:")]
    assert (
        text.splitlines()[-1]
        == f"wrote {tmp_path / 'report.csv'}, {tmp_path / 'accuracy.png'}, {tmp_path / 'eval_loss.png'}"
    )
    for name in ("accuracy.png", "eval_loss.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC
    groups = report.group_runs(report.load_runs(sweep, series=["eval/loss"]))
    fp16 = [_records(sweep / _dir("fp16", s)) for s in (0, 1)]
    curve = report.mean_curve(groups[("compression=fp16",)], x="comm_mb")
    # both seeds send the same bytes each round, so each point is a round: the mean, min and max of their accuracies
    expected = [
        (
            a["comm/mb_total"],
            statistics.fmean((a["eval/accuracy"], b["eval/accuracy"])),
            min(a["eval/accuracy"], b["eval/accuracy"]),
            max(a["eval/accuracy"], b["eval/accuracy"]),
        )
        for a, b in zip(*fp16, strict=True)
    ]
    for got, want in zip(curve, expected, strict=True):
        assert got == pytest.approx(want, rel=1e-12)
    loss = report.mean_curve(groups[("compression=fp16",)], "eval/loss", "comm_mb")
    assert [m for _, m, *_ in loss] == pytest.approx(
        [statistics.fmean((a["eval/loss"], b["eval/loss"])) for a, b in zip(*fp16, strict=True)]
    )

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = report_plot.draw(groups, x="comm_mb")
    FigureCanvasAgg(fig).draw()
    (ax,) = fig.axes
    assert ax.get_xlabel() == "communication, MB both ways (comm/mb_total)"
    assert "latest value" in ax.get_title()
    lines = {t.get_text(): line for t, line in zip(ax.get_legend().get_texts(), ax.get_lines(), strict=True)}
    none = _records(sweep / _dir("none", 0))
    assert list(lines["compression=fp16 (2 seeds)"].get_xdata()) == pytest.approx([x for x, *_ in expected])
    assert list(lines["compression=none (1 seed)"].get_xdata()) == pytest.approx([r["comm/mb_total"] for r in none])
