"""TensorBoard dashboards (histograms, label image, HParams, system scalars) and early stopping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedsim.early_stop import EarlyStop
from fedsim.run import compose, run_config

ROUNDS = 4


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    run_config(compose([f"num_rounds={ROUNDS}", "logger.progress=false"]), run_dir=out)
    return out


def _events(path: Path) -> EventAccumulator:
    return EventAccumulator(str(path), size_guidance={"histograms": 0, "images": 0, "scalars": 0, "tensors": 0}).Reload()


def test_client_histograms_every_round(run_dir: Path) -> None:
    events = _events(run_dir / "tensorboard")
    for tag in ("client/train_loss", "client/update_norm"):
        assert [h.step for h in events.Histograms(tag)] == list(range(1, ROUNDS + 1))
    norms = [c["update_norm"] for c in json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])["clients"]]
    assert len(norms) == 10 and all(n > 0 for n in norms)


def test_scalars_grouped_by_the_five_prefixes(run_dir: Path) -> None:
    events = _events(run_dir / "tensorboard")
    scalars = set(events.Tags()["scalars"])
    assert {tag.split("/")[0] for tag in scalars} == {"train", "eval", "client", "time", "system"}
    for tag in ("client/num_sampled", "client/num_failed", "client/num_examples", "client/num_rejected", "client/num_aggregated"):
        assert [s.step for s in events.Scalars(tag)] == list(range(1, ROUNDS + 1)), tag
    assert [s.value for s in events.Scalars("client/num_sampled")] == [10.0] * ROUNDS
    # the client/ scalars share their prefix with the client/ histograms without replacing them
    assert {"client/train_loss", "client/update_norm"} <= set(events.Tags()["histograms"])
    assert not scalars & set(events.Tags()["histograms"])


def test_label_distribution_image_and_system_scalars(run_dir: Path) -> None:
    events = _events(run_dir / "tensorboard")
    [image] = events.Images("data/label_distribution")
    assert image.step == 0 and image.height == 30 * 4 and image.width == 10 * 8  # 30 clients x 10 classes
    assert [s.step for s in events.Scalars("system/rss_mb")] == list(range(1, ROUNDS + 1))
    assert all(s.value > 10 for s in events.Scalars("system/rss_mb"))


def test_hparams_dashboard_holds_settings_and_results(run_dir: Path) -> None:
    events = _events(run_dir / "tensorboard" / "hparams")
    content = events.PluginTagToContent("hparams")
    assert content, "no HParams data"
    from tensorboard.plugins.hparams import plugin_data_pb2

    blobs = [plugin_data_pb2.HParamsPluginData.FromString(v) for v in content.values()]
    session = next(b.session_start_info for b in blobs if b.HasField("session_start_info"))
    assert session.hparams["client.optimizer.lr"].number_value == pytest.approx(0.01)
    assert session.hparams["strategy._target_"].string_value == "fedsim.strategy.FedAvg"
    assert "hparam/final_accuracy" in events.Tags()["scalars"]


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
