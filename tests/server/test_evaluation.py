"""Where the server evaluates: device names, and the CPU path sharing the server's model and data."""

from __future__ import annotations

import pytest
import torch
from builders import tiny_federation, tiny_server

from fedsim.data.synthetic import synthetic
from fedsim.models import LogisticRegression
from fedsim.server.central_eval import DeviceEvaluator, eval_device
from fedsim.server.settings import Evaluation


def test_auto_is_the_first_gpu_else_the_cpu() -> None:
    expected = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert str(eval_device("auto")) == expected
    assert eval_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name", ["gpu", "tpu", "meta", "", "cuda:63"])
def test_bad_names_and_missing_gpus_are_refused_in_one_line(name: str) -> None:
    with pytest.raises(ValueError) as info:
        eval_device(name)
    assert str(info.value).startswith("eval_device ") and "\n" not in str(info.value)


def test_cpu_evaluation_uses_the_servers_model_and_data_as_they_are() -> None:
    model = LogisticRegression((3,), 2)
    evaluator = DeviceEvaluator(model, torch.device("cpu"))
    params = torch.arange(8, dtype=torch.float32)
    assert evaluator.load(params) is model and torch.equal(model.linear.weight.detach().flatten(), params[:6])
    data = synthetic(num_devices=2, seed=0).test
    assert evaluator.on_device(data) is data


def test_server_on_a_cpu_machine_evaluates_on_the_cpu_with_auto() -> None:
    """The default (auto) gives the same metrics as eval_device=cpu, bit for bit, where there is no GPU."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine auto is cuda:0; tests/executor/test_gpu.py compares the two")

    def history(device: str) -> list[dict]:
        server = tiny_server(
            tiny_federation(6), num_rounds=2, clients_per_round=3, seed=1, evaluation=Evaluation(device=device)
        )
        return server.run().history

    auto, cpu = history("auto"), history("cpu")
    keys = ("eval/loss", "eval/accuracy", "eval_global/loss", "eval_global/accuracy")
    assert [[r[k] for k in keys] for r in auto] == [[r[k] for k in keys] for r in cpu]
