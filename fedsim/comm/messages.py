"""The bytes of a strategy's messages: the arrays a task's config carries besides the model.

A strategy that ships model-sized state to its clients (SCAFFOLD's server control variate c) puts it in the task's
config, and a real client would download it with the model. Each NumPy array or tensor among the config's values
counts with its raw size (``nbytes``: no codec applies to it). Scalars (learning rate, epochs, FedDyn's α) are a
few bytes of settings and are not counted; nor is anything a client already holds (its client state lives on the
client in a deployment, so shipping it to a simulated worker is not traffic).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


def message_nbytes(config: Mapping[str, Any]) -> int:
    """Bytes of the arrays among ``config``'s values (top level only)."""
    total = 0
    for value in config.values():
        if isinstance(value, np.ndarray):
            total += int(value.nbytes)
        elif isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
    return total
