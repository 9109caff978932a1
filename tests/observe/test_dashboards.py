"""TensorBoard dashboards (histograms, label image, HParams, system scalars) and early stopping."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_cli
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedsim.cli.run import compose, run_config
from fedsim.server.early_stop import EarlyStop

ROUNDS = 4


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    run_config(compose([f"num_rounds={ROUNDS}", "logger.progress=false"]), run_dir=out)
    return out


def _events(path: Path) -> EventAccumulator:
    return EventAccumulator(
        str(path), size_guidance={"histograms": 0, "images": 0, "scalars": 0, "tensors": 0}
    ).Reload()


def test_client_histograms_every_round(run_dir: Path) -> None:
    events = _events(run_dir / "tensorboard")
    for tag in ("participants/train_loss", "participants/update_norm"):  # the clients' client/ rows
        assert [h.step for h in events.Histograms(tag)] == list(range(1, ROUNDS + 1))
    norms = [c["update_norm"] for c in json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])["clients"]]
    assert len(norms) == 10 and all(n > 0 for n in norms)


def test_scalars_grouped_with_the_test_metrics_first(run_dir: Path) -> None:
    events = _events(run_dir / "tensorboard")
    scalars = set(events.Tags()["scalars"])
    # TensorBoard orders groups alphabetically: the round's bookkeeping goes under participants/, after eval/
    assert {tag.split("/")[0] for tag in scalars} == {
        "train",
        "eval",
        "eval_global",
        "participants",
        "time",
        "system",
        "summary",
        "traffic",
        "vs_kb_sent",
    }
    assert min(tag.split("/")[0] for tag in scalars | set(events.Tags()["images"])) == "eval"
    for tag in ("participants/num_sampled", "participants/num_examples", "participants/num_aggregated"):
        assert [s.step for s in events.Scalars(tag)] == list(range(1, ROUNDS + 1)), tag
    assert [s.value for s in events.Scalars("participants/num_sampled")] == [10.0] * ROUNDS
    # counters that stayed zero are left out of TensorBoard, not out of metrics.jsonl
    assert not {"participants/num_failed", "participants/num_rejected"} & scalars
    record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert record["client/num_failed"] == 0.0 and record["client/num_rejected"] == 0.0
    assert {"participants/train_loss", "participants/update_norm"} <= set(events.Tags()["histograms"])
    assert not scalars & set(events.Tags()["histograms"])


def test_a_counter_is_shown_from_its_first_non_zero_value(tmp_path: Path) -> None:
    from fedsim.observe.run_logger import RunLogger

    with RunLogger(tmp_path, progress=False) as logger:
        for round_num, failed in enumerate([0.0, 0.0, 2.0, 0.0], start=1):
            logger.log_round(round_num, {"client/num_sampled": 10.0, "client/num_failed": failed})
    events = _events(tmp_path / "tensorboard")
    assert [(s.step, s.value) for s in events.Scalars("participants/num_failed")] == [(3, 2.0), (4, 0.0)]
    assert [s.step for s in events.Scalars("participants/num_sampled")] == [1, 2, 3, 4]


def test_label_distribution_chart_and_system_scalars(run_dir: Path) -> None:
    from PIL import Image

    events = _events(run_dir / "tensorboard")
    [image] = events.Images("partition/label_distribution")
    assert image.step == 0
    chart = Image.open(io.BytesIO(image.encoded_image_string))
    assert chart.size == (image.width, image.height) and image.width >= 400 and image.height >= 200
    colours = np.unique(np.asarray(chart.convert("RGB")).reshape(-1, 3), axis=0)
    assert len(colours) > 50  # a drawn chart (text, colour bar), not an 80x80 grey bitmap
    assert [s.step for s in events.Scalars("system/rss_mb")] == list(range(1, ROUNDS + 1))
    assert all(s.value > 10 for s in events.Scalars("system/rss_mb"))


def _hparams(events: EventAccumulator) -> tuple[dict[str, object], list[str]]:
    """The run's HParams values (as Python values) and its metric column tags."""
    from google.protobuf.json_format import MessageToDict
    from tensorboard.plugins.hparams import plugin_data_pb2

    blobs = [plugin_data_pb2.HParamsPluginData.FromString(v) for v in events.PluginTagToContent("hparams").values()]
    session = next(b.session_start_info for b in blobs if b.HasField("session_start_info"))
    experiment = next(b.experiment for b in blobs if b.HasField("experiment"))
    return MessageToDict(session)["hparams"], [m.name.tag for m in experiment.metric_infos]


def test_hparams_in_the_runs_own_event_files(run_dir: Path) -> None:
    assert [p.name for p in (run_dir / "tensorboard").iterdir() if p.is_dir()] == []  # no hparams sub-run
    events = _events(run_dir / "tensorboard")
    hparams, metrics = _hparams(events)
    # a run from Python has no Hydra overrides: every setting, without Hydra's _target_/_partial_ and logger.*
    assert hparams["client.optimizer.lr"] == pytest.approx(0.01) and hparams["strategy"] == "FedAvg"
    assert not [k for k in hparams if k.endswith(("_target_", "_partial_")) or k.startswith("logger")]
    assert metrics[0] == "eval/accuracy" and "summary/best_accuracy" in metrics
    summary = json.loads((run_dir / "summary.json").read_text())
    [best] = events.Scalars("summary/best_accuracy")
    assert best.step == ROUNDS and best.value == pytest.approx(summary["best_accuracy"])
    assert events.Scalars("eval/accuracy")[-1].value == pytest.approx(summary["final_accuracy"])


def _fedsim(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(args)


def test_a_sweep_shows_what_was_swept_and_quiet_prints_no_round_lines(tmp_path: Path) -> None:
    sweep = _fedsim(
        "-m",
        "num_rounds=2",
        "clients_per_round=3",
        "+client.optimizer.foreach=true,false",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "logger.progress=false",
    )
    assert sweep.returncode == 0, sweep.stderr
    runs = sorted((tmp_path / "sweep").glob("*/tensorboard"))
    assert len(runs) == 2
    for run, foreach in zip(runs, (True, False), strict=True):
        hparams, _ = _hparams(_events(run))
        # the keys set on the command line and strategy/seed; booleans stay booleans, integers their digits (the
        # dashboard would print the number 0 as 0.0000); no logger.* keys
        assert hparams == {
            "strategy": "fedavg",
            "seed": "0",
            "num_rounds": "2",
            "clients_per_round": "3",
            "client.optimizer.foreach": foreach,
        }
    quiet = _fedsim("num_rounds=2", "clients_per_round=3", "logger=quiet", f"hydra.run.dir={tmp_path / 'quiet'}")
    assert quiet.returncode == 0, quiet.stderr
    assert "round" not in quiet.stderr and quiet.stdout.splitlines() == [quiet.stdout.strip()]  # the final line only
    assert quiet.stdout.startswith("final test accuracy")
    assert "round 2: test accuracy" in (tmp_path / "quiet" / "run.log").read_text()  # the log file keeps every line


USER_PKG = Path(__file__).parents[1] / "user_pkg"


@pytest.mark.slow
def test_a_sweeps_run_names_lead_with_what_varies_and_hparams_name_the_class_that_ran(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    from fedsim.observe.run_names import RESOLVER, register_run_label_resolver

    register_run_label_resolver()
    args = (
        "-m",
        "num_rounds=1",
        "clients_per_round=2",
        "+data.max_size=60",
        "strategy._target_=my_strategy.KeepGlobal",
        "seed=0,1",
        f"hydra.sweep.dir={tmp_path}",
        f"hydra.sweep.subdir=${{hydra:job.num}}_${{{RESOLVER}:}}",
        "logger.progress=false",
    )
    sweep = run_cli(args, pythonpath=[USER_PKG])
    assert sweep.returncode == 0, sweep.stderr
    # TensorBoard's own reader names the runs by their directories below --logdir: the swept seed first, the fixed
    # settings after it with their keys shortened (strategy._target_ clashes with nothing: _target_)
    runs = EventMultiplexer().AddRunsFromDirectory(str(tmp_path)).Runs()
    fixed = "num_rounds=1,clients_per_round=2,max_size=60,_target_=my_strategy.KeepGlobal"
    assert sorted(runs) == [f"0_seed=0,{fixed}/tensorboard", f"1_seed=1,{fixed}/tensorboard"]
    hparams, _ = _hparams(_events(tmp_path / f"1_seed=1,{fixed}" / "tensorboard"))
    # the class that ran, not the option (fedavg) whose _target_ the command line replaced
    assert hparams["strategy"] == "my_strategy.KeepGlobal" and hparams["seed"] == "1"


def test_a_run_label_puts_the_swept_settings_first_and_shortens_the_rest() -> None:
    from fedsim.observe.run_names import sweep_run_label, swept_keys

    swept = swept_keys(["num_rounds=5", "client.optimizer.lr=0.05,0.1", "seed=range(3)", "+a.b.x=1"], ["p.q"])
    assert swept == ["client.optimizer.lr", "seed", "p.q"]
    job = ["num_rounds=5", "client.optimizer.lr=0.1", "seed=2", "+a.b.x=1", "++c.x=2", "experiment=e", "~d", "p.q=3"]
    label = sweep_run_label([*job, "logger.progress=False"], swept, exclude=["experiment", "logger"])
    # x clashes between a.b.x and c.x: those keep their whole key; a deletion names nothing to compare
    assert label == "client.optimizer.lr=0.1,seed=2,p.q=3,num_rounds=5,a.b.x=1,c.x=2"
    assert sweep_run_label(["data.root=/tmp/x", "seed=0"], ["seed"]) == "seed=0,root=_tmp_x"  # no sub-directory


def test_hparams_show_a_custom_target_as_its_class(tmp_path: Path) -> None:
    from fedsim.observe.tensorboard_log import shown_hparams

    hydra = tmp_path / ".hydra"
    hydra.mkdir()
    (hydra / "hydra.yaml").write_text("hydra:\n  runtime:\n    choices:\n      strategy: fedavg\n      model: mlp\n")
    settings = {"seed": 0, "strategy._target_": "my_strategy.KeepGlobal", "model._target_": "fedsim.models.MLP"}
    (hydra / "overrides.yaml").write_text("[]\n")
    # a class outside fedsim under the option fedavg: the class that ran, not the option's name
    assert shown_hparams(settings, tmp_path) == {"strategy": "my_strategy.KeepGlobal", "seed": 0}
    (hydra / "overrides.yaml").write_text("['strategy._target_=fedsim.strategy.FedProx', 'model=mlp']\n")
    settings["strategy._target_"] = "fedsim.strategy.FedProx"
    assert shown_hparams(settings, tmp_path) == {"strategy": "FedProx", "seed": 0, "model": "mlp"}
    (hydra / "overrides.yaml").write_text("['strategy=fedavg']\n")
    settings["strategy._target_"] = "fedsim.strategy.FedAvg"
    assert shown_hparams(settings, tmp_path) == {"strategy": "fedavg", "seed": 0}


def test_early_stop_known_answers() -> None:
    stop = EarlyStop(target_accuracy=0.8)
    assert stop.check({"round": 1, "eval/accuracy": 0.5}) is None
    assert stop.check({"round": 2}) is None  # not evaluated this round
    assert "round 3" in stop.check({"round": 3, "eval/accuracy": 0.81})
    patient = EarlyStop(patience=2)
    history = [{"round": r, "eval/accuracy": a} for r, a in [(1, 0.5), (2, 0.6), (3, 0.55), (4, 0.6)]]
    assert [patient.check(h) for h in history[:3]] == [None, None, None]
    reason = patient.check(history[3])
    assert reason == "no better accuracy than 0.6000 in 2 evaluations (round 4)"
    replayed = EarlyStop(patience=2)
    replayed.replay(history[:3])  # a resumed run rebuilds the same state from its history
    assert replayed.check(history[3]) == reason
    with pytest.raises(ValueError, match="early_stop.patience"):
        EarlyStop(patience=0)


def test_a_run_stops_at_its_target_and_records_why(tmp_path: Path) -> None:
    result = run_config(compose(["num_rounds=30", "early_stop.target_accuracy=0.3", "logger=quiet"]), run_dir=tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rounds"] == len(result.history) < 30
    assert summary["stop_reason"].startswith("early stop: reached target accuracy 0.3")
    assert result.history[-1]["eval/accuracy"] >= 0.3 > max(r["eval/accuracy"] for r in result.history[:-1])
