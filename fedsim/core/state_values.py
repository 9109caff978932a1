"""What a client state may hold, and the copies that keep a task from touching anyone else's state.

A client state is a ``dict`` with string keys whose values are tensors or plain values (``int``,
``float``, ``str``, ``bool``, ``None``) and lists, tuples and string-keyed dicts of them: exactly what a
checkpoint can load back with ``weights_only=True``. Tensors are kept on the CPU.
"""

from __future__ import annotations

from typing import Any

import torch

PLAIN = (int, float, str, bool, type(None))
ALLOWED = "tensors and plain values (int, float, str, bool, None, and lists, tuples and str-keyed dicts of them)"


def state_problem(state: Any, where: str = "state") -> str | None:
    """Why ``state`` cannot be a client state (one line naming the offending entry), or ``None``."""
    if not isinstance(state, dict):
        return f"{where} must be a dict, not {type(state).__name__}"
    return _value_problem(state, where)


def _value_problem(value: Any, where: str) -> str | None:
    if isinstance(value, (torch.Tensor, *PLAIN)):
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where} has the key {key!r}: keys must be strings"
            problem = _value_problem(item, f"{where}[{key!r}]")
            if problem:
                return problem
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            problem = _value_problem(item, f"{where}[{index}]")
            if problem:
                return problem
        return None
    return f"{where} is a {type(value).__name__}; client state holds {ALLOWED}"


def copy_state(value: Any) -> Any:
    """A deep copy with every tensor detached, cloned and on the CPU (what a task gets, what a store keeps)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: copy_state(item) for key, item in value.items()}
    if isinstance(value, list):
        return [copy_state(item) for item in value]
    if isinstance(value, tuple):
        return tuple(copy_state(item) for item in value)
    return value


def states_equal(a: Any, b: Any) -> bool:
    """Whether two states hold the same values, tensors compared bit for bit (dtype and shape included)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(states_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(states_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
