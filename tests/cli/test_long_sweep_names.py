"""A sweep's job names never break a run (issue #43): a label over 200 bytes keeps a readable prefix and ends with a
digest of the whole, so that every directory name, and TensorBoard's run names, fit the filesystem; the full
overrides stay in ``.hydra/overrides.yaml``, where the report groups the runs by them."""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import numpy as np
import pytest
import yaml
from cli_runner import run_cli

from fedsim.observe.run_names import MAX_LABEL_BYTES, fit_label
from fedsim.report import command as report

FIXED = [  # 38 settings, with the data in a deep folder: labels of ~900 bytes, paths' "/" as "_"
    "num_rounds=1",
    "clients_per_round=2",
    "eval_every=1",
    "eval_device=cpu",
    "client_test_fraction=0.25",
    "min_success_fraction=1.0",
    "checkpoint_every=0",
    "keep_checkpoints=1",
    "state_store=memory",
    "server_threads=1",
    "data=npz",
    "data.num_classes=3",
    "partition=natural",
    "model=logreg",
    "client=sgd",
    "client.epochs=1",
    "client.batch_size=10",
    "client.optimizer.momentum=0.0",
    "client.optimizer.weight_decay=0.0",
    "executor=serial",
    "executor.threads=1",
    "executor.device=cpu",
    "strategy=fedavg",
    "stragglers.fraction=0.0",
    "early_stop.target_accuracy=1.0",
    "early_stop.patience=1000",
    "objective.metric=eval/accuracy",
    "objective.reduce=final",
    "compression=none",
    "compression.error_feedback=false",
    "attack=none",
    "attack.fraction=0.2",
    "attack.per_round=false",
    "dp=none",
    "clock=none",
    "evaluate_clients=sampled",
    "tracker=none",
]
LRS = ("0.01", "0.05")
SWEPT = [f"client.optimizer.lr={','.join(LRS)}", "seed=0,1"]


def _arrays(root: Path) -> Path:
    """A tiny .npz (4 owners of 10 rows of 5 features, 3 classes) in a folder two long names deep."""
    folder = root / ("experiments_of_a_project_" + "x" * 100) / ("federated_instruction_tuning_" + "y" * 100)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    path = folder / "arrays.npz"
    np.savez(
        path,
        x_train=rng.normal(size=(40, 5)).astype(np.float32),
        y_train=rng.integers(0, 3, 40),
        x_test=rng.normal(size=(12, 5)).astype(np.float32),
        y_test=rng.integers(0, 3, 12),
        client_ids=np.repeat(np.arange(4), 10),
    )
    return path


def test_a_label_that_fits_is_unchanged_and_a_long_one_keeps_its_head_and_a_digest() -> None:
    short = ["strategy=fedprox", "seed=1"]
    assert fit_label(short) == "strategy=fedprox,seed=1"
    entries = [f"key{i}=" + "v" * 30 for i in range(40)]  # 37 bytes each: 5 fit with the tail, 35 left out
    digest = hashlib.sha256(",".join(entries).encode()).hexdigest()[:10]
    assert fit_label(entries) == ",".join(entries[:5]) + f",+35_more_{digest}"
    assert len(fit_label(entries).encode()) <= MAX_LABEL_BYTES
    assert fit_label(entries[:-1] + ["key39=w"]) != fit_label(entries)  # another job, another digest
    huge = "path=" + "é" * 300  # one entry over the limit: cut at a character, never inside one
    label = fit_label([huge, "seed=0"])
    digest = hashlib.sha256(f"{huge},seed=0".encode()).hexdigest()[:10]
    assert label.startswith("path=éé") and label.endswith(f"...,+1_more_{digest}")
    assert len(label.encode()) <= MAX_LABEL_BYTES and "..." in label


@pytest.mark.slow
def test_a_sweep_of_40_long_overrides_runs_and_every_name_fits(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    fixed = [*FIXED, f"data.path={_arrays(tmp_path)}"]
    assert len(fixed) + len(SWEPT) == 40
    sweep_dir = tmp_path / "sweep"
    run = run_cli(["-m", *fixed, *SWEPT, "logger.progress=false", f"hydra.sweep.dir={sweep_dir}"])
    assert run.returncode == 0, run.stderr
    jobs = sorted(p for p in sweep_dir.iterdir() if p.is_dir())
    assert len(jobs) == 4
    for job in jobs:
        assert len(job.name.encode()) <= 255 and (job / "summary.json").exists()
        overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
        assert len(overrides) == 40 + 1 and fixed[-1] in overrides  # all of them (logger's too), in full
    # the readable head: what the sweep varies first, then the fixed settings, then the digest of the whole
    assert jobs[0].name.startswith(f"0_client.optimizer.lr={LRS[0]},seed=0,num_rounds=1,clients_per_round=2,")
    assert "_more_" in jobs[0].name and len({job.name.rsplit("_", 1)[-1] for job in jobs}) == 4
    # TensorBoard names the runs by their directories below --logdir: every name in them fits
    runs = EventMultiplexer().AddRunsFromDirectory(str(sweep_dir)).Runs()
    assert sorted(runs) == [f"{job.name}/tensorboard" for job in jobs]
    assert all(len(part.encode()) <= 255 for name in runs for part in Path(name).parts)

    assert report.main([str(sweep_dir), "--out", str(tmp_path / "report")]) == 0
    with open(tmp_path / "report" / "report.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    # grouped by the full overrides (seed aside): one configuration per learning rate, two seeds each
    assert len(rows) == 2 and {row["seeds_finished"] for row in rows} == {"2"}
    for row, lr in zip(rows, LRS, strict=True):
        assert f"client.optimizer.lr={lr}" in row["configuration"]


@pytest.mark.parametrize("sweep", [False, True])
def test_a_directory_name_of_ones_own_too_long_is_one_line(sweep: bool, tmp_path: Path) -> None:
    too_long = tmp_path / ("x" * 300)
    where = ["-m", "seed=0,1", f"hydra.sweep.dir={too_long}"] if sweep else [f"hydra.run.dir={too_long}"]
    run = run_cli([*where, "num_rounds=1", "logger.progress=false"])
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert run.stderr.startswith(f"fedsim: error: cannot create {too_long}") and "choose a shorter" in run.stderr
    assert list(tmp_path.iterdir()) == []
