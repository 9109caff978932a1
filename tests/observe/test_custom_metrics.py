"""Custom metrics: a client's own metrics (``fit/<name>``, per-client ``metrics``) and a strategy's scalars
(``strategy/<name>``) in metrics.jsonl, TensorBoard and fedsim.report; hand-computed numbers first."""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import logging
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from builders import sgd, tiny_federation, tiny_server
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedsim.client.base import Client
from fedsim.client.federation import FederatedData
from fedsim.core.types import ClientUpdate
from fedsim.executor import ProcessExecutor, SerialExecutor
from fedsim.executor.base import Executor
from fedsim.observe.run_logger import RunLogger
from fedsim.report import command as report
from fedsim.server.round_metrics import client_row, strategy_client_values, strategy_scalars, train_metrics
from fedsim.server.settings import Evaluation
from fedsim.strategy import FedAvg, Strategy

ROUNDS, PER_ROUND = 3, 4


def _update(client_id: int, num_examples: int, **metrics: Any) -> ClientUpdate:
    return ClientUpdate(
        client_id=client_id,
        round_num=1,
        params=torch.zeros(3),
        num_examples=num_examples,
        metrics={"train_loss": 1.0, "local_steps": 4.0, "lr": 0.1, **metrics},
    )


class _Reporting(Strategy):
    """Aggregates nothing; reports whatever it was given (per client: ``per_client``)."""

    def __init__(self, scalars: Any, per_client: Any = None) -> None:
        self.scalars, self.per_client = scalars, per_client

    def client_metrics(self, round_num: int) -> Any:
        return self.per_client

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: list[ClientUpdate]) -> torch.Tensor:
        return global_params

    def round_metrics(self, round_num: int) -> Any:
        return self.scalars


# ---------------------------------------------------------------- round_metrics, by hand


def test_fit_means_are_example_weighted_over_the_clients_that_report_them() -> None:
    updates = [_update(0, 10, personal_loss=1.0, acc=0.5), _update(1, 30, personal_loss=3.0), _update(2, 60, acc=1.0)]
    metrics = train_metrics(updates, num_sampled=4)
    assert metrics["fit/personal_loss"] == pytest.approx((10 * 1.0 + 30 * 3.0) / 40)  # 2.5; client 2 left out
    assert metrics["fit/acc"] == pytest.approx((10 * 0.5 + 60 * 1.0) / 70)  # 65/70; client 1 left out
    assert metrics["train/loss"] == 1.0 and metrics["client/num_failed"] == 1.0
    assert not {"fit/train_loss", "fit/local_steps", "fit/lr"} & set(metrics)  # fedsim's own keys stay out
    assert "fit/personal_loss" not in train_metrics([_update(0, 10)], 1)  # nobody reported: no scalar


def test_fit_mean_is_nan_when_a_client_reports_nan_or_no_examples() -> None:
    assert math.isnan(train_metrics([_update(0, 10, x=math.nan), _update(1, 10, x=1.0)], 2)["fit/x"])
    assert math.isnan(train_metrics([_update(0, 0, x=1.0)], 1)["fit/x"])


def test_client_row_holds_only_the_extra_numeric_keys() -> None:
    row = client_row(_update(7, 10, personal_loss=2, diverged=math.inf), torch.ones(3))
    assert row["metrics"] == {"personal_loss": 2.0, "diverged": None}  # ints become floats, inf JSON null
    assert row["client_id"] == 7 and row["update_norm"] == pytest.approx(math.sqrt(3))
    assert "metrics" not in client_row(_update(7, 10), torch.zeros(3))


def test_non_numeric_client_metrics_are_ignored_with_one_warning_per_key(caplog: pytest.LogCaptureFixture) -> None:
    updates = [_update(i, 10, note_cm="text", flag_cm=True, **{"bad name cm": 1.0}, ok=1.0) for i in range(3)]
    with caplog.at_level(logging.WARNING, logger="fedsim"):
        rows = [client_row(u, torch.zeros(3)) for u in updates]
        metrics = train_metrics(updates, 3)
    assert all(r["metrics"] == {"ok": 1.0} for r in rows)
    assert [k for k in metrics if k.startswith("fit/")] == ["fit/ok"]
    warnings = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert len(warnings) == 3 and all("[A-Za-z0-9_.\\-/]+" in w for w in warnings)  # one per bad key
    assert any("'note_cm' = 'text'" in w for w in warnings)


def test_strategy_scalars_are_prefixed_and_floats() -> None:
    got = strategy_scalars(_Reporting({"h_norm": 2, "lr.server": 0.5, "x/y-z": math.nan}), 1)
    assert list(got) == ["strategy/h_norm", "strategy/lr.server", "strategy/x/y-z"]
    assert got["strategy/h_norm"] == 2.0 and type(got["strategy/h_norm"]) is float and math.isnan(got["strategy/x/y-z"])
    assert strategy_scalars(FedAvg(), 1) == {}


@pytest.mark.parametrize(
    ("scalars", "words"),
    [
        ({"h_norm": "big"}, ["_Reporting.round_metrics()", "'h_norm'", "numbers"]),
        ({"chosen": True}, ["_Reporting.round_metrics()", "'chosen'", "numbers"]),
        ({"chosen": torch.tensor(1.0)}, ["'chosen'", "numbers"]),
        ({"h norm": 1.0}, ["_Reporting.round_metrics()", "'h norm'", "must match"]),
        ({3: 1.0}, ["_Reporting.round_metrics()", "3", "must match"]),
        ([("h_norm", 1.0)], ["_Reporting.round_metrics()", "dict"]),
    ],
)
def test_bad_strategy_scalars_raise_naming_strategy_and_key(scalars: Any, words: list[str]) -> None:
    with pytest.raises(ValueError) as error:
        strategy_scalars(_Reporting(scalars), 1)
    assert all(word in str(error.value) for word in words), str(error.value)
    assert "\n" not in str(error.value)


def test_strategy_client_values_are_floats_with_nan_as_none() -> None:
    got = strategy_client_values(_Reporting({}, {3: {"trust": 1, "w.x/y": math.inf}, 5: {}}), 1, [3, 5, 7])
    assert got == {3: {"trust": 1.0, "w.x/y": None}, 5: {}} and type(got[3]["trust"]) is float
    assert strategy_client_values(FedAvg(), 1, [1, 2]) == {}


@pytest.mark.parametrize(
    ("per_client", "words"),
    [
        ({9: {"trust": 1.0}}, ["_Reporting.client_metrics()", "client 9", "did not aggregate"]),
        ({"3": {"trust": 1.0}}, ["client '3'", "did not aggregate"]),
        ({True: {"trust": 1.0}}, ["client True", "did not aggregate"]),
        ({3: {"trust": "high"}}, ["_Reporting.client_metrics()", "'trust'", "client 3", "numbers"]),
        ({3: {"trust": torch.tensor(1.0)}}, ["'trust'", "numbers"]),
        ({3: {"tr ust": 1.0}}, ["'tr ust'", "must match"]),
        ({3: [1.0]}, ["client 3", "dict of name -> number"]),
        ([(3, {"trust": 1.0})], ["_Reporting.client_metrics()", "dict of client id"]),
    ],
)
def test_bad_strategy_client_values_raise_naming_strategy_client_and_key(per_client: Any, words: list[str]) -> None:
    with pytest.raises(ValueError) as error:
        strategy_client_values(_Reporting({}, per_client), 1, [3, 5])
    assert all(word in str(error.value) for word in words), str(error.value)
    assert "\n" not in str(error.value)


def test_a_bad_client_value_stops_the_run_with_one_line_naming_the_strategy(tmp_path: Path) -> None:
    from fedsim.core.errors import StrategyError

    class Bad(FedAvg):
        def client_metrics(self, round_num: int) -> dict[int, dict[str, float]]:
            return {-5: {"trust": 1.0}}

    data = _data(6)
    with pytest.raises(
        StrategyError,
        match=r"^round 1: Bad.client_metrics\(\) returned values for client -5, "
        r"whose update it did not aggregate this round$",
    ):
        tiny_server(data, strategy=Bad(), num_rounds=1, clients_per_round=3, evaluation=Evaluation(device="cpu")).run()


# ---------------------------------------------------------------- end to end


class PersonalClient(Client):
    """Reports ``personal_loss`` (a function of its training loss) when its id is even."""

    def fit(self, *args: Any, **kwargs: Any) -> ClientUpdate:
        update = super().fit(*args, **kwargs)
        if self.client_id % 2:
            return update
        value = 0.5 * update.metrics["train_loss"] + self.client_id
        return dataclasses.replace(update, metrics={**update.metrics, "personal_loss": value})


class CountingFedAvg(FedAvg):
    """FedAvg that reports how many updates it has aggregated so far."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.shares: dict[int, dict[str, float]] = {}

    def aggregate(self, round_num: int, global_params: torch.Tensor, updates: list[ClientUpdate]) -> torch.Tensor:
        self.count += len(updates)
        total = sum(u.num_examples for u in updates)
        self.shares = {u.client_id: {"weight": u.num_examples / total} for u in updates}  # each client's FedAvg weight
        return super().aggregate(round_num, global_params, updates)

    def round_metrics(self, round_num: int) -> dict[str, float]:
        return {"update_count": self.count}

    def client_metrics(self, round_num: int) -> dict[int, dict[str, float]]:
        return dict(self.shares)


def _data(num_devices: int) -> FederatedData:
    """Tiny Synthetic(1, 1): devices of 30..60 examples, 10 features, 5 classes, no local test rows."""
    return tiny_federation(
        num_devices, num_features=10, num_classes=5, min_size=30, size_sigma_log=0.5, client_test_fraction=0.0
    )


def _run(executor: Executor, run_dir: Path) -> None:
    tiny_server(
        _data(12),
        client=functools.partial(PersonalClient, epochs=1, batch_size=10, optimizer=sgd(0.05)),
        strategy=CountingFedAvg(),
        executor=executor,
        num_rounds=ROUNDS,
        clients_per_round=PER_ROUND,
        logger=RunLogger(run_dir, progress=False),
        evaluation=Evaluation(device="cpu"),
    ).run()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two runs of the same setup under one directory: ``serial`` and ``process`` (two workers)."""
    root = tmp_path_factory.mktemp("sweep")
    _run(SerialExecutor(), root / "serial")
    _run(ProcessExecutor(devices="cpu", workers=2), root / "process")
    return root


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_metrics_jsonl_has_rows_fit_means_and_strategy_scalars(sweep: Path) -> None:
    records = _records(sweep / "serial")
    assert [r["strategy/update_count"] for r in records] == [4.0, 8.0, 12.0]
    reported = 0
    for record in records:
        rows = record["clients"]
        assert all(("metrics" in r) == (r["client_id"] % 2 == 0) for r in rows)  # odd ids report nothing
        for r in rows:
            if "metrics" in r:
                assert r["metrics"] == {"personal_loss": pytest.approx(0.5 * r["train_loss"] + r["client_id"])}
        evens = [r for r in rows if "metrics" in r]
        if evens:
            reported += 1
            mean = sum(r["metrics"]["personal_loss"] * r["num_examples"] for r in evens) / sum(
                r["num_examples"] for r in evens
            )
            assert record["fit/personal_loss"] == pytest.approx(mean, rel=1e-12)
        else:
            assert "fit/personal_loss" not in record
        # the strategy's per-client values: every aggregated client's FedAvg weight, in its row
        assert [r["strategy"] for r in rows] == [
            {"weight": pytest.approx(r["num_examples"] / sum(c["num_examples"] for c in rows))} for r in rows
        ]
    assert reported >= 2


def test_process_executor_gives_the_same_custom_metrics_exactly(sweep: Path) -> None:
    def custom(run_dir: Path) -> list[dict[str, Any]]:
        return [
            {k: v for k, v in r.items() if k.startswith(("fit/", "strategy/", "train/"))} for r in _records(run_dir)
        ]

    serial, process = custom(sweep / "serial"), custom(sweep / "process")
    assert serial == process and any("fit/personal_loss" in r for r in serial)
    rows = [
        [(c["client_id"], c.get("metrics"), c["strategy"]) for c in r["clients"]] for r in _records(sweep / "process")
    ]
    assert rows == [
        [(c["client_id"], c.get("metrics"), c["strategy"]) for c in r["clients"]] for r in _records(sweep / "serial")
    ]


def test_tensorboard_reads_back_the_custom_scalars_and_histograms(sweep: Path) -> None:
    records = _records(sweep / "serial")
    events = EventAccumulator(
        str(sweep / "serial" / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0}
    ).Reload()
    for tag in ("fit/personal_loss", "strategy/update_count"):
        want = [(r["round"], r[tag]) for r in records if tag in r]
        got = [(s.step, s.value) for s in events.Scalars(tag)]
        assert [step for step, _ in got] == [step for step, _ in want]
        assert [value for _, value in got] == pytest.approx([value for _, value in want], rel=1e-6)  # float32
    histograms = events.Histograms("participants/fit/personal_loss")
    assert [h.step for h in histograms] == [r["round"] for r in records if "fit/personal_loss" in r]
    first = next(r for r in records if "fit/personal_loss" in r)
    assert histograms[0].histogram_value.num == sum("metrics" in c for c in first["clients"])
    weights = events.Histograms("participants/strategy/weight")  # the strategy's per-client values
    assert [h.step for h in weights] == [r["round"] for r in records]
    assert weights[0].histogram_value.num == len(records[0]["clients"])
    assert weights[0].histogram_value.sum == pytest.approx(1.0, rel=1e-6)
    assert not set(events.Tags()["scalars"]) & set(events.Tags()["histograms"])  # no tag holds both


def test_report_shows_the_named_scalars(sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    last = _records(sweep / "serial")
    personal = next(r["fit/personal_loss"] for r in reversed(last) if "fit/personal_loss" in r)
    argv = [str(sweep), "--out", str(tmp_path), "--metric", "fit/personal_loss", "--metric", "strategy/update_count"]
    assert report.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("configuration"))
    assert header.split()[-2:] == ["fit/personal_loss", "strategy/update_count"]
    for name in ("serial", "process"):  # one seed each: the final value itself
        row = next(line for line in lines if line.startswith(name))
        assert row.split()[-2:] == [f"{personal:.4f}", "12.0000"], row
    with open(tmp_path / "report.csv") as csv_file:
        rows = {r["configuration"]: r for r in csv.DictReader(csv_file)}
    assert float(rows["serial"]["fit/personal_loss_mean"]) == personal and rows["serial"]["fit/personal_loss_std"] == ""
    assert float(rows["process"]["strategy/update_count_mean"]) == 12.0


# ---------------------------------------------------------------- report --metric on hand-made runs


def _fake(root: Path, name: str, records: list[dict[str, Any]]) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "metrics.jsonl").write_text(
        "".join(json.dumps({"round": i + 1, **r}) + "\n" for i, r in enumerate(records))
    )


def test_metric_column_is_last_logged_value_mean_std_over_seeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake(tmp_path, "0_seed=0,s=a", [{"eval/accuracy": 0.5, "fit/p": 1.0}, {"eval/accuracy": 0.6}])  # p last at round 1
    _fake(tmp_path, "1_seed=1,s=a", [{"eval/accuracy": 0.5, "fit/p": 2.0}, {"eval/accuracy": 0.6, "fit/p": 3.0}])
    _fake(tmp_path, "2_seed=0,s=b", [{"eval/accuracy": 0.5, "fit/p": None}])  # logged NaN
    _fake(tmp_path, "3_seed=0,s=c", [{"eval/accuracy": 0.5}])  # never logged
    assert report.main([str(tmp_path), "--metric", "fit/p", "--metric", "fit/p", "--metric", "nowhere"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^configuration .* wall s\s+fit/p\s+nowhere$", out, re.M)
    assert re.search(r"^s=a .*\s2\.0000 ± 1\.4142\s+-$", out, re.M)  # finals 1.0 and 3.0
    assert re.search(r"^s=b .*\snan\s+-$", out, re.M) and re.search(r"^s=c .*\s-\s+-$", out, re.M)
    assert "fedsim.report: no run logged nowhere" in out
    with open(tmp_path / "report.csv") as csv_file:
        rows = {r["configuration"]: r for r in csv.DictReader(csv_file)}
    assert float(rows["s=a"]["fit/p_mean"]) == 2.0 and float(rows["s=a"]["fit/p_std"]) == pytest.approx(math.sqrt(2))
    assert rows["s=c"]["fit/p_mean"] == "" and list(rows["s=a"])[-4:] == [
        "fit/p_mean",
        "fit/p_std",
        "nowhere_mean",
        "nowhere_std",
    ]


def test_without_metric_the_columns_are_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fake(tmp_path, "0_seed=0", [{"eval/accuracy": 0.5, "fit/p": 1.0, "time/round_s": 1.0}])
    assert report.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[0].split() == [
        "configuration",
        "seeds",
        "rounds",
        "final",
        "acc",
        "best",
        "acc",
        "wall",
        "s",
    ]
    with open(tmp_path / "report.csv") as csv_file:
        (row,) = csv.DictReader(csv_file)
    assert list(row)[-1] == "wall_time_s_mean" and not any(k.startswith("fit/") for k in row)


def test_metric_name_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        report.main([str(tmp_path), "--metric", "fit personal"])
    assert exit_info.value.code == 2 and "must be a scalar name" in capsys.readouterr().err
