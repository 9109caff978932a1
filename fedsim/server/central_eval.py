"""Where the server evaluates the global model: the CPU, or a GPU with the test set copied there once.

On a GPU machine, evaluating a CIFAR-sized test set on the server's CPU every round can take longer than
the round's training on the GPUs; ``eval_device=auto`` (the default) evaluates on the first GPU when
there is one. Metrics then differ from a CPU evaluation in the last bits (GPU kernels round
differently); training is not affected.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import cast

import torch
from torch import nn

from fedsim.client.scoring import evaluate_indices
from fedsim.core.params import load_flat
from fedsim.data.tensor_data import TensorData


def eval_device(name: str) -> torch.device:
    """``"auto"``: ``cuda:0`` if a GPU is visible, else the CPU; otherwise ``"cpu"`` or ``"cuda[:N]"``.
    Anything else, or a GPU that is not there, is refused with one line naming ``eval_device``."""
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"eval_device must be auto, cpu or cuda:N (got {name!r})") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"eval_device must be auto, cpu or cuda:N (got {name!r})")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = 0 if device.index is None else device.index
        if index >= count:
            raise ValueError(
                f"eval_device asks for {name} but {count} CUDA device(s) are visible; use eval_device=auto or cpu"
            )
        device = torch.device("cuda", index)
    return device


class DeviceEvaluator:
    """Holds the model the server evaluates with: ``model`` itself on the CPU, a copy of it on a GPU."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.device = device
        self.model = model if device.type == "cpu" else copy.deepcopy(model).to(device)
        self._data: dict[int, tuple[TensorData, TensorData]] = {}  # id(source) -> (source, copy on device)

    def load(self, params: torch.Tensor) -> nn.Module:
        """The evaluation model holding the flat global weights ``params``."""
        load_flat(self.model, params)
        return self.model

    def on_device(self, data: TensorData) -> TensorData:
        """``data`` on the evaluation device, copied once per dataset (the test set is read every round)."""
        if self.device.type == "cpu":
            return data
        source, copied = self._data.get(id(data), (None, None))
        if source is not data:
            copied = replace(data, x=data.x.to(self.device), y=data.y.to(self.device))
            self._data[id(data)] = (data, copied)
        return cast(TensorData, copied)  # set just above when it was not yet


def evaluate_global(evaluator: DeviceEvaluator, test_data: TensorData | None, params: torch.Tensor) -> dict[str, float]:
    """Loss and accuracy of ``params`` on the centralized test set (empty without one); for a language model's token
    labels, token loss, token accuracy and perplexity."""
    if test_data is None or len(test_data) == 0:
        return {}
    result = evaluate_indices(evaluator.load(params), evaluator.on_device(test_data))
    perplexity = {"eval/perplexity": result["perplexity"]} if "perplexity" in result else {}  # token labels
    return {"eval/loss": result["loss"], "eval/accuracy": result["accuracy"]} | perplexity
