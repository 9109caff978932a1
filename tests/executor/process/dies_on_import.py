"""A model factory whose module SIGKILLs the process that imports it, once (tracked by a marker file named in
FEDSIM_TEST_DIE_MARKER): a worker killed while it unpickles its start message."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch

_marker = os.environ.get("FEDSIM_TEST_DIE_MARKER")
if _marker and not Path(_marker).exists() and os.environ.get("FEDSIM_TEST_PARENT") != str(os.getpid()):
    Path(_marker).write_text(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGKILL)


def linear(input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    return torch.nn.Linear(input_shape[0], num_classes)
