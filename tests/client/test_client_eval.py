"""Every-client evaluation (fedsim.client.evaluation, fedsim.executor.eval_task): who is scored and when, known
answers of the distribution, the per-client file and TensorBoard histograms, and the same scores under every
executor."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from builders import tiny_federation, tiny_server
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import fedsim.client.evaluation as client_eval
from fedsim.client import Client, evaluate_indices
from fedsim.client.evaluation import ClientEvaluation, eval_tasks, spread, summary
from fedsim.client.federation import make_clients
from fedsim.core.seeding import sampling_rng
from fedsim.core.types import ClientScore
from fedsim.executor import ProcessExecutor, SerialExecutor, VmapExecutor
from fedsim.executor.base import Executor, Workload
from fedsim.models import MLP2NN, LogisticRegression
from fedsim.observe.run_logger import RunLogger
from fedsim.server.server import Server
from fedsim.server.settings import Evaluation
from fedsim.strategy import FedAvg, FedPer, Strategy


def _data(fraction: float = 0.25):  # type: ignore[no-untyped-def]
    return tiny_federation(12, seed=2, client_test_fraction=fraction)


def _server(
    executor: Executor,
    *,
    strategy: Strategy | None = None,
    fraction: float = 0.25,
    run_dir: Path | None = None,
    who: str = "all",
    client: type[Client] = Client,
    mlp: bool = False,
) -> Server:
    return tiny_server(
        _data(fraction),
        model=functools.partial(MLP2NN, (60,), 10, hidden=16) if mlp else None,
        client=client,
        strategy=strategy,
        executor=executor,
        num_rounds=2,
        logger=RunLogger(run_dir, progress=False),
        evaluation=Evaluation(clients=ClientEvaluation(who)),
    )


def _files(run_dir: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((run_dir / "client_eval").glob("*.csv"))}


def _eval_metrics(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k.startswith("eval")} for r in history]


# --- known answers ----------------------------------------------------------------------------------------------


def test_spread_of_ten_clients() -> None:
    values = np.arange(10) / 10  # 0.0, 0.1, ..., 0.9
    got = spread(values, higher_is_better=True)
    # mean 0.45; population variance mean((x - 0.45)²) = 0.0825; p10 at position 0.9 between 0.0 and 0.1 -> 0.09
    assert got["mean"] == pytest.approx(0.45) and got["std"] == pytest.approx(math.sqrt(0.0825))
    assert (got["p10"], got["p50"], got["p90"]) == pytest.approx((0.09, 0.45, 0.81))
    assert (got["worst10"], got["best10"]) == (0.0, 0.9)  # ⌈10 % of 10⌉ = 1 client each
    as_loss = spread(values, higher_is_better=False)
    assert (as_loss["worst10"], as_loss["best10"]) == (0.9, 0.0)  # for a loss the worst is the highest
    assert spread(np.arange(11) / 10, True)["worst10"] == pytest.approx(0.05)  # ⌈1.1⌉ = 2 clients: mean(0.0, 0.1)


def test_summary_weights_by_examples_and_counts_personal_models() -> None:
    scores = [ClientScore(0, 1, 2.0, 1.0, 1.0, 1.0, True), ClientScore(1, 3, 4.0, 0.0, 3.0, 0.5, False)]
    got = summary(scores, personal=True)
    assert (
        got["eval_global/accuracy"] == 0.25 and got["eval_global/accuracy_mean"] == 0.5
    )  # (1·1 + 3·0) / 4; (1 + 0) / 2
    assert got["eval_global/loss"] == 3.5 and got["eval_global/clients"] == 2.0  # (1·2 + 3·4) / 4
    assert got["eval_personal/accuracy"] == 0.625 and got["eval_personal/loss_worst10"] == 3.0  # (1 + 1.5) / 4
    assert got["eval_personal/personalised"] == 1.0
    assert not any(k.startswith("eval_personal") for k in summary(scores, personal=False))


def test_tasks_group_clients_by_test_examples_in_id_order() -> None:
    sizes = {4: 10, 0: 1500, 1: 0, 2: 600, 3: 2000}
    clients = [Client(cid, [0], list(range(sizes[cid]))) for cid in range(5)]
    tasks = eval_tasks(7, [4, 3, 2, 1, 0], clients, state_of=lambda cid: {"id": cid})
    # 1500 + 600 >= 2048 closes the first group; client 1 has no test data; 2000 + 10 is the rest
    assert [t.client_ids for t in tasks] == [(0, 2), (3, 4)] and {t.round_num for t in tasks} == {7}
    assert tasks[1].states == ({"id": 3}, {"id": 4}) and eval_tasks(7, [3], clients)[0].states == ()


def test_who_and_when() -> None:
    assert ClientEvaluation("all").clients([3, 1], 5, seed=0) == [0, 1, 2, 3, 4]
    assert ClientEvaluation().clients([3, 1], 5, seed=0) == [1, 3]
    cohort = ClientEvaluation("cohort", size=4)
    drawn = cohort.clients([], 50, seed=3)
    assert drawn == sorted(set(drawn)) and len(drawn) == 4 and drawn == cohort.clients([1], 50, seed=3)
    assert drawn != cohort.clients([], 50, seed=4)
    every3 = ClientEvaluation(every=3)
    assert [r for r in range(1, 11) if every3.due(r, eval_every=2, num_rounds=10)] == [3, 6, 9, 10]
    assert [r for r in range(1, 6) if ClientEvaluation().due(r, eval_every=2, num_rounds=5)] == [2, 4, 5]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"who": "everyone"}, "evaluate_clients.who"),
        ({"who": "cohort"}, "evaluate_clients.size"),
        ({"who": "all", "size": 3}, "evaluate_clients.size"),
        ({"every": 0}, "evaluate_clients.every"),
    ],
)
def test_bad_settings_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ClientEvaluation(**kwargs)
    with pytest.raises(ValueError, match=r"evaluate_clients.size must be <= the 12 clients"):
        ClientEvaluation("cohort", size=13).check(12)


# --- through the server -----------------------------------------------------------------------------------------


def test_sampled_clients_accuracy_is_the_example_weighted_mean_of_their_own_evaluations() -> None:
    server = _server(SerialExecutor(), who="sampled")
    last = server.run().history[-1]
    sampled = FedAvg().sample(2, 12, 4, sampling_rng(0, 2))
    results = [
        evaluate_indices(server.model, server.parts.train_data, torch.from_numpy(server.clients[c].test_indices))
        for c in sampled
    ]
    n = sum(r["num_examples"] for r in results)
    assert last["eval_global/clients"] == 4
    assert last["eval_global/accuracy"] == pytest.approx(sum(r["accuracy"] * r["num_examples"] for r in results) / n)
    assert last["eval_global/loss"] == pytest.approx(sum(r["loss"] * r["num_examples"] for r in results) / n)


def test_no_client_metrics_without_local_test_data() -> None:
    assert all(
        not k.startswith("eval_global") for r in _server(SerialExecutor(), fraction=0.0).run().history for k in r
    )


def test_every_client_is_scored_into_a_file_and_tensorboard(tmp_path: Path) -> None:
    history = _server(SerialExecutor(), run_dir=tmp_path).run().history
    files = _files(tmp_path)
    assert list(files) == ["round-0001.csv", "round-0002.csv"]
    rows = files["round-0002.csv"].splitlines()
    assert rows[0] == "client,num_examples,loss,accuracy" and len(rows) == 13  # header + the 12 clients
    table = np.array([[float(x) for x in row.split(",")] for row in rows[1:]])
    assert history[-1]["eval_global/accuracy"] == pytest.approx(
        float(np.sum(table[:, 1] * table[:, 3]) / np.sum(table[:, 1]))
    )
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"histograms": 0, "scalars": 0}).Reload()
    assert {"eval_global/client_accuracy", "eval_global/client_loss"} <= set(events.Tags()["histograms"])
    assert [e.step for e in events.Scalars("eval_global/accuracy_p10")] == [1, 2]
    histogram = events.Histograms("eval_global/client_accuracy")[-1].histogram_value
    assert histogram.num == 12 and histogram.min == table[:, 3].min() and histogram.max == table[:, 3].max()


def test_scores_are_bitwise_the_same_under_serial_process_and_vmap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_eval, "EXAMPLES_PER_TASK", 25)  # several groups, so that several workers score
    runs = {}
    for name, executor in (("serial", SerialExecutor()), ("process", ProcessExecutor(devices="cpu", workers=3))):
        history = _server(executor, run_dir=tmp_path / name).run().history
        runs[name] = (_files(tmp_path / name), _eval_metrics(history))
    assert len(eval_tasks(2, range(12), make_clients(_data(), Client))) > 3
    assert runs["process"] == runs["serial"]
    # vmap trains with batched kernels, so a vmap run's model differs from serial's in the last bits; its
    # evaluation is the serial code on the same weights, so with the same weights the scores are equal exactly
    data = _data()
    clients = make_clients(data, Client)
    params = torch.randn(610, generator=torch.Generator().manual_seed(3)) * 0.1  # LogisticRegression((60,), 10)
    tasks = eval_tasks(1, range(12), clients)
    scored = []
    for executor in (SerialExecutor(), VmapExecutor()):
        executor.start(Workload(functools.partial(LogisticRegression, (60,), 10), clients, data.train))
        scored.append([r.scores for r in executor.evaluate(params, tasks)])
        executor.close()
    assert scored[0] == scored[1] and sum(len(s) for s in scored[0]) == 12


def test_personal_models_are_scored_alongside_the_global_one_in_worker_processes_too(tmp_path: Path) -> None:
    serial = _server(SerialExecutor(), strategy=FedPer(), mlp=True, run_dir=tmp_path / "serial").run().history
    process = (
        _server(ProcessExecutor(devices="cpu", workers=2), strategy=FedPer(), mlp=True, run_dir=tmp_path / "process")
        .run()
        .history
    )
    assert _files(tmp_path / "serial") == _files(tmp_path / "process") and _eval_metrics(serial) == _eval_metrics(
        process
    )
    last = serial[-1]
    assert 0 < last["eval_personal/personalised"] < 12  # 8 clients trained over 2 rounds of 4, some of them twice
    rows = [row.split(",") for row in _files(tmp_path / "serial")["round-0002.csv"].splitlines()[1:]]
    untrained, trained = [r for r in rows if r[-1] == "0"], [r for r in rows if r[-1] == "1"]
    assert untrained and all(r[2:4] == r[4:6] for r in untrained)  # no personal model yet: the global model's values
    assert trained and all(r[2] != r[4] for r in trained)  # its own head: another loss


class OwnEvaluation(Client):
    """A client with its own evaluation (scored one by one, with its own numbers)."""

    def evaluate(self, model: torch.nn.Module, data, *, batch_size: int = 256) -> dict[str, float]:  # type: ignore[no-untyped-def]
        if self.client_id == 5:
            raise RuntimeError("cannot evaluate client 5")
        return {"loss": float(self.client_id), "accuracy": 0.5, "num_examples": float(self.test_indices.size)}


def test_a_clients_own_evaluate_is_used_and_a_failing_one_is_reported(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(client_eval, "EXAMPLES_PER_TASK", 25)
    history = _server(SerialExecutor(), client=OwnEvaluation, run_dir=tmp_path).run().history
    rows = [row.split(",") for row in _files(tmp_path)["round-0001.csv"].splitlines()[1:]]
    assert rows and all(float(r[2]) == float(r[0]) and r[3] == "0.5" for r in rows)
    assert "5" not in [r[0] for r in rows]  # its group failed: logged, counted, left out of the distribution
    assert all(r["eval_global/failed_tasks"] == 1.0 for r in history)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("client_eval/failure" in w and "cannot evaluate client 5" in w for w in warnings)
