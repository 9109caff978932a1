"""Real Hydra multirun sweeps and ``python -m fedsim.report`` (a fresh Python process) over one.

Two sweeps run side by side in a module fixture: a 2x2 grid (strategy x partition.alpha) over two seeds, every
client evaluated, with TensorBoard on the serial executor, in this process (tests/cli_runner.py: what is checked
of it does not depend on a fresh process); and two seeds on one CPU worker process, from a fresh ``python -m
fedsim`` whose environment tags its workers (to look for leftovers).
"""

from __future__ import annotations

import csv
import json
import os
import re
import statistics
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from cli_runner import run_cli
from matplotlib import image as mpimg
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TIMEOUT_S = 180
FIXED = [
    "clients_per_round=5",
    "evaluate_clients=all",
    "logger.progress=False",
    "num_rounds=2",
    "partition.num_clients=20",
    "partition=dirichlet",
]
CONFIGS = [(strategy, alpha) for strategy in ("fedavg", "ditto") for alpha in ("0.1", "1.0")]  # job order
SEEDS = (0, 1)
CSV_COLUMNS = [
    "configuration",
    "seeds_finished",
    "seeds_total",
    "rounds_min",
    "rounds_max",
    "final_accuracy_mean",
    "final_accuracy_std",
    "best_accuracy_mean",
    "best_accuracy_std",
    "wall_time_s_mean",
]


def _fedsim(args: list[str], cwd: Path, tag: str) -> subprocess.Popen[str]:
    env = {**os.environ, "FEDSIM_REPORT_TEST": tag}  # inherited by worker processes: finds leftovers exactly
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.Popen(
        [sys.executable, "-m", "fedsim", "-m", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The two sweeps (the process one in a fresh process, the grid meanwhile in this one), then the report over
    the grid one."""
    cwd, tag = tmp_path_factory.mktemp("sweeps"), uuid.uuid4().hex
    process = _fedsim(
        [
            "seed=0,1",
            "num_rounds=1",
            "logger=quiet",
            "executor=process",
            "executor.devices=cpu",
            "executor.workers=1",
            f"hydra.sweep.dir={cwd / 'process'}",
        ],
        cwd,
        tag,
    )
    grid = run_cli(
        [
            "-m",
            "strategy=fedavg,ditto",
            "partition.alpha=0.1,1.0",
            "seed=0,1",
            *FIXED,
            f"hydra.sweep.dir={cwd / 'grid'}",
        ],
        cwd=cwd,
    )
    outputs = {"grid": grid.stdout + grid.stderr, "process": process.communicate(timeout=TIMEOUT_S)[0]}
    procs = {"grid": grid, "process": process}
    rep = subprocess.run(
        [sys.executable, "-m", "fedsim.report", str(cwd / "grid")],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    return {"cwd": cwd, "tag": tag, "procs": procs, "outputs": outputs, "report": rep}


def job_dirs(root: Path) -> dict[tuple[str, str, int], Path]:
    """Where each (strategy, alpha, seed) job must have written: ``<job number>_<what the sweep varies, in the order
    given>,<the fixed overrides, keys shortened>`` (fedsim/observe/run_names.py; logger.progress left out)."""
    jobs = [(s, a, seed) for s, a in CONFIGS for seed in SEEDS]
    return {
        (s, a, seed): root
        / (
            f"{i}_strategy={s},partition.alpha={a},seed={seed},"
            "clients_per_round=5,evaluate_clients=all,num_rounds=2,num_clients=20,partition=dirichlet"
        )
        for i, (s, a, seed) in enumerate(jobs)
    }


def seed_stats(root: Path, strategy: str, alpha: str, key: str) -> tuple[float, float]:
    """Mean and sample std over the seeds of one configuration, from the jobs' own summary.json."""
    dirs = job_dirs(root)
    values = [json.loads((dirs[strategy, alpha, seed] / "summary.json").read_text())[key] for seed in SEEDS]
    return statistics.fmean(values), statistics.stdev(values)


@pytest.mark.slow
def test_each_job_has_its_own_dir_events_metrics_and_summary(real: dict[str, Any]) -> None:
    assert real["procs"]["grid"].returncode == 0, real["outputs"]["grid"][-3000:]
    root = real["cwd"] / "grid"
    dirs = job_dirs(root)
    assert {p for p in root.iterdir() if p.is_dir()} == set(dirs.values())
    for (strategy, alpha, seed), run_dir in dirs.items():
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["round"] for r in records] == [1, 2]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert (summary["rounds"], summary["finished"], summary["final_accuracy"]) == (
            2,
            True,
            records[-1]["eval/accuracy"],
        )
        assert any((run_dir / "tensorboard").glob("events.out.tfevents.*"))
        scalars = EventAccumulator(str(run_dir / "tensorboard")).Reload().Scalars("eval/accuracy")
        assert [s.value for s in scalars] == pytest.approx(
            [r["eval/accuracy"] for r in records], abs=1e-6
        )  # this job's
        overrides = (run_dir / ".hydra" / "overrides.yaml").read_text()
        assert (
            f"strategy={strategy}" in overrides
            and f"partition.alpha={alpha}" in overrides
            and f"seed={seed}" in overrides
        )


@pytest.mark.slow
def test_report_table_has_the_four_configurations_with_mean_and_std_over_seeds(real: dict[str, Any]) -> None:
    rep, root = real["report"], real["cwd"] / "grid"
    assert rep.returncode == 0, rep.stderr[-3000:]
    lines = rep.stdout.splitlines()
    assert lines[0] == "common overrides: " + " ".join(FIXED)
    assert lines[1].split() == ["configuration", "seeds", "rounds", "final", "acc", "best", "acc", "wall", "s"]
    assert len(lines) == 2 + len(CONFIGS) + 1 and lines[-1].startswith("wrote ")
    for line, (strategy, alpha) in zip(lines[2:6], CONFIGS, strict=True):
        final, best = (
            seed_stats(root, strategy, alpha, "final_accuracy"),
            seed_stats(root, strategy, alpha, "best_accuracy"),
        )
        cells = rf"{final[0]:.4f} ± {final[1]:.4f}\s+{best[0]:.4f} ± {best[1]:.4f}"
        assert re.fullmatch(rf"partition\.alpha={alpha},strategy={strategy}\s+2/2\s+2\s+{cells}\s+\d+\.\d", line), line


@pytest.mark.slow
def test_report_csv_has_one_row_per_configuration(real: dict[str, Any]) -> None:
    root = real["cwd"] / "grid"
    with open(root / "report.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == CSV_COLUMNS
    assert [r["configuration"] for r in rows] == [  # the settings that differ first, then the shared ones
        ",".join([f"partition.alpha={a}", f"strategy={s}", *sorted(FIXED)]) for s, a in CONFIGS
    ]
    for row, (strategy, alpha) in zip(rows, CONFIGS, strict=True):
        assert (row["seeds_finished"], row["seeds_total"], row["rounds_min"], row["rounds_max"]) == ("2", "2", "2", "2")
        for key in ("final_accuracy", "best_accuracy"):
            mean, std = seed_stats(root, strategy, alpha, key)
            assert (float(row[f"{key}_mean"]), float(row[f"{key}_std"])) == pytest.approx((mean, std))
        assert float(row["wall_time_s_mean"]) == pytest.approx(seed_stats(root, strategy, alpha, "wall_time_s")[0])


@pytest.mark.slow
def test_report_png_is_a_real_image(real: dict[str, Any]) -> None:
    png = real["cwd"] / "grid" / "accuracy.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    pixels = mpimg.imread(png)
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100 and pixels.std() > 0  # drawn, not blank


@pytest.mark.slow
def test_report_tables_and_plots_a_per_client_statistic(
    real: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--metric eval_personal/accuracy_worst10``: a column (mean ± std over seeds of the final value; only Ditto has
    personal models) and a plot of it."""
    from fedsim.report import command as report

    root, name = real["cwd"] / "grid", "eval_personal/accuracy_worst10"
    assert report.main([str(root), "--out", str(tmp_path), "--metric", name]) == 0
    assert "eval_personal/accuracy_worst10" in capsys.readouterr().out
    with open(tmp_path / "report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for row, (strategy, alpha) in zip(rows, CONFIGS, strict=True):
        finals = [_final(job_dirs(root)[strategy, alpha, seed], name) for seed in SEEDS]
        if strategy == "fedavg":
            assert finals == [None, None] and row[f"{name}_mean"] == ""
        else:
            assert float(row[f"{name}_mean"]) == pytest.approx(statistics.fmean(finals))
    assert (tmp_path / "eval_personal_accuracy_worst10.png").read_bytes()[:8] == PNG_MAGIC


@pytest.mark.slow
def test_report_puts_personal_and_global_accuracy_in_one_column_and_one_plot(
    real: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--metric``/``--plot eval_personal/accuracy_mean,eval/accuracy``: each run gives the first of the list it
    logged, Ditto's the mean accuracy of its personal models, FedAvg's (no personal model) its test accuracy."""
    from fedsim.report import command as report
    from fedsim.report import plot as report_plot
    from fedsim.report.runs import load_runs

    root, name, personal = (
        real["cwd"] / "grid",
        "eval_personal/accuracy_mean,eval/accuracy",
        "eval_personal/accuracy_mean",
    )
    assert report.main([str(root), "--out", str(tmp_path), "--metric", name, "--plot", name]) == 0
    out = capsys.readouterr().out.splitlines()
    assert name in out[1].split()  # the table's column is named by the list
    fedavg = [f"partition.alpha={a},strategy=fedavg" for s, a in CONFIGS if s == "fedavg"]
    assert f"fedsim.report: {name}: eval/accuracy for {', '.join(fedavg)}; {personal} for the other 2" in out
    with open(tmp_path / "report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    used = {"fedavg": "eval/accuracy", "ditto": personal}
    for row, (strategy, alpha) in zip(rows, CONFIGS, strict=True):
        finals = [_final(job_dirs(root)[strategy, alpha, seed], used[strategy]) for seed in SEEDS]
        assert float(row[f"{name}_mean"]) == pytest.approx(statistics.fmean(finals))
        assert strategy == "ditto" or _final(job_dirs(root)[strategy, alpha, 0], personal) is None
    assert (tmp_path / "eval_personal_accuracy_mean_eval_accuracy.png").read_bytes()[:8] == PNG_MAGIC
    # the figure: one curve per configuration, each the mean over seeds of its own scalar, round by round
    groups = report.group_runs(load_runs(root, series=[personal, "eval/accuracy"]))
    figure = report_plot.draw(groups, name)
    assert figure is not None
    curves = figure.axes[0].get_lines()
    assert len(curves) == len(CONFIGS) and figure.axes[0].get_ylabel() == f"{personal} or eval/accuracy"
    for curve, (strategy, alpha) in zip(curves, CONFIGS, strict=True):
        per_seed = [_series(job_dirs(root)[strategy, alpha, seed], used[strategy]) for seed in SEEDS]
        assert list(curve.get_ydata()) == pytest.approx([statistics.fmean(v) for v in zip(*per_seed, strict=True)])
        assert curve.get_label().replace("\n", " ").endswith(f"; {used[strategy]})")


def _series(run_dir: Path, name: str) -> list[float]:
    return [json.loads(line)[name] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _final(run_dir: Path, name: str) -> float | None:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return records[-1].get(name)


@pytest.mark.slow
def test_process_sweep_leaves_no_worker_behind(real: dict[str, Any]) -> None:
    assert real["procs"]["process"].returncode == 0, real["outputs"]["process"][-3000:]
    logs = sorted((real["cwd"] / "process").glob("*/workers/worker-*.log"))
    pids = {int(pid) for log in logs for pid in re.findall(r"\(pid (\d+),", log.read_text())}
    assert len(logs) == 2 and len(pids) == 2  # one worker per job, each job its own pool
    alive = [pid for pid in pids if _has_tag(pid, real["tag"])]
    assert alive == [], f"worker processes left behind: {alive}"


def _has_tag(pid: int, tag: str) -> bool:
    """Whether ``pid`` is alive and carries our environment tag (a recycled pid would not)."""
    try:
        return f"FEDSIM_REPORT_TEST={tag}".encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
