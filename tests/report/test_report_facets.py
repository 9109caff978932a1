"""fedsim.report --facet, --x epsilon, --epsilon-budget, --metric NAME:AGG and the labels' order, on hand-made run
directories with hand-computed numbers. ``facet_sweep`` also draws docs/img/report-facets.png:
``python tests/report/test_report_facets.py OUT_DIR`` (tiny fake runs, not results)."""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedsim.report import command as report
from fedsim.report import plot as report_plot
from fedsim.report import runs as report_runs

STRATEGIES = ("fedavg", "fedprox", "scaffold")
LRS = ("0.01", "0.05", "0.1")
EPOCHS = ("1", "2", "5", "10")
SHARED = ("num_rounds=20", "data.num_devices=100", "clients_per_round=10")


def write_run(root: Path, num: int, overrides: list[str], records: list[dict[str, Any]]) -> Path:
    """A finished run dir: metrics.jsonl (``records``, ``round`` added), summary.json, .hydra/overrides.yaml."""
    run_dir = root / f"{num}_{','.join(o for o in overrides if not o.startswith(tuple(SHARED)))}"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    lines = [json.dumps({"round": i + 1, **r}) + "\n" for i, r in enumerate(records)]
    (run_dir / "metrics.jsonl").write_text("".join(lines))
    summary = {"rounds": len(records), "finished": True, "stop_reason": "completed", "wall_time_s": 1.0}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def facet_sweep(root: Path, rounds: int = 20) -> Path:
    """36 configurations (3 strategies x 3 learning rates x 4 epoch counts, 3 shared overrides), 2 seeds each:
    smooth made-up accuracy curves that differ by setting, for the picture only."""
    num = 0
    for s, strategy in enumerate(STRATEGIES):
        for k, lr in enumerate(LRS):
            for e, epochs in enumerate(EPOCHS):
                for seed in (0, 1):
                    top = 0.55 + 0.08 * s + 0.05 * k - 0.02 * e + 0.01 * seed
                    tau = 2.0 + 3.0 * (2 - k) / (1 + e)
                    accs = [top * (1 - math.exp(-r / tau)) for r in range(1, rounds + 1)]
                    overrides = [f"strategy={strategy}", f"client.optimizer.lr={lr}", f"client.epochs={epochs}"]
                    write_run(root, num, [*overrides, f"seed={seed}", *SHARED], [{"eval/accuracy": a} for a in accs])
                    num += 1
    return root


def dp_sweep(root: Path) -> Path:
    """Two DP configurations (``dp.noise_multiplier`` 1.0 and 2.0, 2 seeds each) and one without DP (1 seed); every
    run also logs ``attack/malicious_aggregated`` each round (``null`` in one round of one run)."""
    eps = {"1.0": [(0.5, 0.2, 1), (1.0, 0.6, 0), (1.5, 0.5, 2)], "2.0": [(0.25, 0.3, 0), (0.5, 0.4, 1), (0.75, 0.7, 1)]}
    num = 0
    for z, rows in eps.items():
        for seed in (0, 1):
            records = [
                {"eval/accuracy": acc + 0.1 * seed, "dp/epsilon": e * (1 + seed), "attack/malicious_aggregated": m}
                for e, acc, m in rows
            ]
            write_run(root, num, [f"dp.noise_multiplier={z}", "dp=central", f"seed={seed}"], records)
            num += 1
    plain = [{"eval/accuracy": a, "attack/malicious_aggregated": m} for a, m in [(0.5, 2), (0.8, None), (0.9, 1)]]
    write_run(root, num, ["dp.noise_multiplier=0", "dp=none", "seed=0"], plain)
    return root


@pytest.fixture
def dp(tmp_path: Path) -> Path:
    return dp_sweep(tmp_path / "sweep")


def _csv(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return {row["configuration"]: row for row in csv.DictReader(f)}


# ---------------------------------------------------------------- accuracy against epsilon


def test_accuracy_within_budget_is_the_last_evaluated_round_within_it(dp: Path) -> None:
    runs = {(r.config, r.seed): r for r in report.load_runs(dp)}
    z1 = ("dp.noise_multiplier=1.0", "dp=central")
    # seed 0 spends 0.5, 1.0, 1.5; seed 1 twice that: 1.0, 2.0, 3.0
    assert report.accuracy_within(runs[z1, "0"], 1.0) == pytest.approx(0.6)  # round 2 (1.0 <= 1.0), not the best
    assert report.accuracy_within(runs[z1, "0"], 10.0) == pytest.approx(0.5)  # the last round, though 0.6 was better
    assert report.accuracy_within(runs[z1, "1"], 1.0) == pytest.approx(0.3)  # round 1 only
    assert report.accuracy_within(runs[z1, "1"], 0.9) is None  # its first round already spent 1.0
    assert report.accuracy_within(runs[("dp.noise_multiplier=0", "dp=none"), "0"], 1.0) is None


def test_epsilon_budget_column_and_csv(dp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = dp / "out"
    assert report.main([str(dp), "--out", str(out), "--epsilon-budget", "1", "--plot", "nothing/logged"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("configuration"))
    assert header.endswith("acc at eps<=1  wall s")
    rows = {line.split()[0]: line for line in lines[lines.index(header) + 1 :][:3]}
    # z=1.0: seed 0 -> 0.6 (round 2), seed 1 -> 0.3 (round 1): mean 0.45, std sqrt(0.045); z=2.0: seed 0 -> 0.7
    # (round 3, 0.75), seed 1 (0.5, 1.0, 1.5) -> 0.5 (round 2)
    assert f"0.4500 ± {math.sqrt(0.045):.4f} (2/2)" in rows["dp.noise_multiplier=1.0,dp=central"]
    assert f"0.6000 ± {math.sqrt(0.02):.4f} (2/2)" in rows["dp.noise_multiplier=2.0,dp=central"]
    assert "- (no DP)" in rows["dp.noise_multiplier=0,dp=none"]
    csv_rows = _csv(out / "report.csv")
    row = csv_rows["dp.noise_multiplier=1.0,dp=central"]
    assert float(row["epsilon_budget"]) == 1.0 and row["seeds_within_epsilon"] == "2"
    assert float(row["accuracy_at_epsilon_mean"]) == pytest.approx(0.45)
    assert float(row["accuracy_at_epsilon_std"]) == pytest.approx(math.sqrt(0.045))
    assert csv_rows["dp.noise_multiplier=0,dp=none"]["accuracy_at_epsilon_mean"] == ""


def test_x_epsilon_plots_against_the_budget_and_names_runs_without_dp(
    dp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = dp / "out"
    assert report.main([str(dp), "--out", str(out), "--x", "epsilon"]) == 0
    text = capsys.readouterr().out
    assert text.count("logged no dp/epsilon") == 1
    assert "fedsim.report: 4_dp.noise_multiplier=0,dp=none,seed=0 logged no dp/epsilon (no DP); left out" in text
    assert (out / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    groups = report.group_runs(report.load_runs(dp))
    curve = report.mean_curve(groups[("dp.noise_multiplier=2.0", "dp=central")], x="epsilon")
    # seed 0: (0.25, 0.3) (0.5, 0.4) (0.75, 0.7); seed 1: (0.5, 0.4) (1.0, 0.5) (1.5, 0.8): latest value of each
    expected = [(0.25, 0.3), (0.5, 0.4), (0.75, 0.55), (1.0, 0.6), (1.5, 0.75)]
    assert [t for t, *_ in curve] == pytest.approx([t for t, _ in expected])
    assert [m for _, m, *_ in curve] == pytest.approx([m for _, m in expected])
    fig = report_plot.draw(groups, x="epsilon")
    assert fig is not None and fig.axes[0].get_xlabel() == "privacy budget spent, ε (dp/epsilon)"


def test_epsilon_budget_without_any_dp_run_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path, 0, ["strategy=a", "seed=0"], [{"eval/accuracy": 0.5}])
    assert report.main([str(tmp_path), "--epsilon-budget", "2", "--plot", "x"]) == 0
    text = capsys.readouterr().out
    assert "fedsim.report: no run logged dp/epsilon (run with differential privacy, dp=central or dp=adaptive)" in text


@pytest.mark.parametrize("budget", ["0", "-1", "nan", "inf"])
def test_epsilon_budget_must_be_positive(dp: Path, budget: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        report.main([str(dp), "--epsilon-budget", budget])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "must be a privacy budget ε > 0" in err


# ---------------------------------------------------------------- --metric NAME:AGG


def test_metric_aggregated_over_rounds(dp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = dp / "out"
    name = "attack/malicious_aggregated"
    argv = [str(dp), "--out", str(out), "--plot", "x"]
    for agg in ("sum", "mean", "max", "min", "last"):
        argv += ["--metric", f"{name}:{agg}"]
    assert report.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("configuration"))
    assert header.split()[-5:] == [f"{name}:sum", f"{name}:mean", f"{name}:max", f"{name}:min", name]
    rows = _csv(out / "report.csv")
    z1 = rows["dp.noise_multiplier=1.0,dp=central"]  # both seeds log 1, 0, 2
    assert [float(z1[f"{name}{suffix}_mean"]) for suffix in (":sum", ":mean", ":max", ":min", "")] == [3, 1, 2, 0, 2]
    z2 = rows["dp.noise_multiplier=2.0,dp=central"]  # 0, 1, 1
    assert [float(z2[f"{name}{suffix}_mean"]) for suffix in (":sum", ":mean", ":max", ":min", "")] == pytest.approx(
        [2, 2 / 3, 1, 0, 1]
    )
    assert z2[f"{name}:sum_std"] == "0.0"
    plain = rows["dp.noise_multiplier=0,dp=none"]  # 2, null, 1: a null round makes every aggregate NaN but last
    assert [plain[f"{name}{suffix}_mean"] for suffix in (":sum", ":mean", ":max", ":min", "")] == [
        "nan",
        "nan",
        "nan",
        "nan",
        "1.0",
    ]


def test_over_rounds_by_hand() -> None:
    values = [3.0, 1.0, 2.0]
    assert [report_runs.over_rounds(values, agg) for agg in report_runs.AGGREGATES] == [2.0, 2.0, 6.0, 3.0, 1.0]
    assert report_runs.over_rounds([], "sum") is None
    assert report_runs.split_metric("a/b:sum") == ("a/b", "sum") and report_runs.split_metric("a/b") == ("a/b", "last")


def test_unknown_aggregate_is_one_line_naming_the_allowed_ones(dp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        report.main([str(dp), "--metric", "comm/bytes_up:median"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert "'comm/bytes_up:median': AGG must be one of last, mean, sum, max, min (got 'median')" in err


def test_grid_of_an_aggregated_metric(dp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = dp / "out"
    argv = [str(dp), "--out", str(out), "--plot", "x", "--grid", "dp", "dp.noise_multiplier"]
    assert report.main([*argv, "--metric", "attack/malicious_aggregated:sum"]) == 0
    text = capsys.readouterr().out
    assert "attack/malicious_aggregated:sum, mean ± std over seeds" in text
    assert "3.0000 ± 0.0000" in text  # z=1.0: 1 + 0 + 2 for both seeds


# ---------------------------------------------------------------- --facet and labels


@pytest.fixture(scope="module")
def facets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return facet_sweep(tmp_path_factory.mktemp("facets") / "sweep", rounds=4)


def test_facet_panels_one_per_value_with_one_legend_of_the_remaining_settings(facets: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    groups = report.group_runs(report.load_runs(facets))
    assert len(groups) == 36
    fig = report_plot.draw(groups, target=0.5, facet="strategy")
    assert fig is not None
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    assert [ax.get_title() for ax in fig.axes] == [f"strategy={s} (2 seeds each)" for s in STRATEGIES]
    assert all(ax.get_shared_y_axes().joined(fig.axes[0], ax) for ax in fig.axes)
    assert all(ax.get_shared_x_axes().joined(fig.axes[0], ax) for ax in fig.axes)
    assert all(len(ax.get_lines()) == 12 + 1 for ax in fig.axes)  # 12 settings and the target
    (legend,) = fig.legends
    names = [t.get_text() for t in legend.get_texts()]
    assert names == [f"epochs={e}, lr={lr}" for lr in LRS for e in EPOCHS] + ["target 0.5"]
    for i in range(12):  # a setting has one colour and style in every panel
        assert len({(ax.get_lines()[i].get_color(), ax.get_lines()[i].get_linestyle()) for ax in fig.axes}) == 1
    assert legend.get_window_extent(renderer).x0 > max(ax.get_window_extent(renderer).x1 for ax in fig.axes)
    saved = fig.get_tightbbox(renderer).padded(0.1).transformed(fig.dpi_scale_trans)
    for text in (t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and _in_view(fig, t)):
        box = text.get_window_extent(renderer)
        assert saved.x0 <= box.x0 and box.x1 <= saved.x1 and saved.y0 <= box.y0 and box.y1 <= saved.y1, text
    notes = [t.get_text() for t in fig.findobj(Text) if t.get_text().startswith("common overrides:")]
    assert notes == ["common overrides: clients_per_round=10 data.num_devices=100 num_rounds=20"]


def _in_view(fig: Any, text: Any) -> bool:
    """False for a tick label outside its axes' limits (matplotlib keeps it, but does not draw it)."""
    for ax in fig.axes:
        if text in ax.get_xticklabels():
            return bool(min(ax.get_xlim()) <= text.get_position()[0] <= max(ax.get_xlim()))
        if text in ax.get_yticklabels():
            return bool(min(ax.get_ylim()) <= text.get_position()[1] <= max(ax.get_ylim()))
    return True


def test_facet_by_a_key_some_runs_do_not_give(tmp_path: Path) -> None:
    write_run(tmp_path, 0, ["strategy=a", "attack=x", "seed=0"], [{"eval/accuracy": 0.5}])
    write_run(tmp_path, 1, ["strategy=b", "seed=0"], [{"eval/accuracy": 0.6}])
    fig = report_plot.draw(report.group_runs(report.load_runs(tmp_path)), facet="attack")
    assert fig is not None and [ax.get_title() for ax in fig.axes] == ["attack=x (1 seed)", "attack=(default) (1 seed)"]


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("seed", "fedsim.report: --facet cannot use seed: a curve is the mean over the seeds"),
        ("nope", "fedsim.report: --facet: no run overrides nope (the runs' keys: client.epochs, client.optimizer.lr"),
    ],
)
def test_a_facet_that_cannot_be_drawn_is_one_line_and_exit_2(
    facets: Path, key: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert report.main([str(facets), "--facet", key, "--out", str(facets.parent / "unused")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
    assert not (facets.parent / "unused").exists()  # refused before any work


def test_main_writes_faceted_png_and_labels_put_differing_settings_first(
    facets: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = facets.parent / "out"
    assert report.main([str(facets), "--facet", "strategy", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "common overrides: clients_per_round=10 data.num_devices=100 num_rounds=20"
    assert lines[2].split()[0] == "client.epochs=1,client.optimizer.lr=0.01,strategy=fedavg"
    assert (out / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first = next(iter(_csv(out / "report.csv")))
    assert first == (
        "client.epochs=1,client.optimizer.lr=0.01,strategy=fedavg,"
        "clients_per_round=10,data.num_devices=100,num_rounds=20"
    )


if __name__ == "__main__":  # draw docs/img/report-facets.png's sweep into sys.argv[1], then report it
    sweep = facet_sweep(Path(sys.argv[1]) / "sweep")
    sys.exit(report.main([str(sweep), "--facet", "strategy", "--out", str(Path(sys.argv[1]) / "out")]))
