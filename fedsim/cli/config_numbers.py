"""Numbers in the group sections (data, partition, model, client, strategy, executor) checked against the
constructor they are meant for, before any work.

A group section names its class or function in ``_target_``; each key is one of its parameters. Where the
parameter is annotated (or defaults to) a number, the value must be one: an ``int`` parameter takes an
integer, a ``float`` one any finite number; NaN, ±inf, strings and booleans are refused with one line that
names the field's full dotted name. ``null`` passes only where the parameter accepts ``None``. This covers
your own classes plugged in with ``_target_`` as well as fedsim's and torch's (``client.optimizer.lr``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

GROUPS = ("data", "partition", "model", "client", "strategy", "executor", "tracker", "clock", "dp", "attack")


def check_numbers(cfg: DictConfig, error: Callable[[str], Exception]) -> None:
    """Raise ``error(line)`` for the first group value that is not the number its parameter expects."""
    for group in GROUPS:
        node = cfg.get(group)
        if isinstance(node, DictConfig):
            _check_node(node, group, error)


def _check_node(node: DictConfig, path: str, error: Callable[[str], Exception]) -> None:
    accepted = parameters(node.get("_target_"))
    for key in node:
        key = str(key)
        if key.startswith("_"):
            continue
        value = node[key]
        if isinstance(value, DictConfig):
            _check_node(value, f"{path}.{key}", error)
        elif key in accepted:
            problem = _problem(accepted[key], value)
            if problem:
                raise error(f"{path}.{key} {problem} (got {value!r})")


def parameters(target: Any) -> dict[str, inspect.Parameter]:
    """The parameters of ``_target_`` by name; none when it cannot be imported (instantiation reports that)."""
    if not isinstance(target, str):
        return {}
    from hydra.utils import get_object

    try:
        return dict(inspect.signature(get_object(target)).parameters)
    except Exception:  # noqa: BLE001 - unknown or unimportable targets are instantiate's to report
        return {}


def _expects(parameter: inspect.Parameter) -> tuple[str | None, bool]:
    """("int" | "float" | None, whether None is accepted) from the annotation, else from the default."""
    annotation = parameter.annotation if parameter.annotation is not inspect.Parameter.empty else ""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    text = text.replace(" ", "")
    default = parameter.default
    optional = "None" in text or "Optional" in text or default is None
    if text in ("int", "int|None", "Optional[int]", "None|int"):
        return "int", optional
    if "float" in text:
        return "float", optional
    if not text and isinstance(default, (int, float)) and not isinstance(default, bool):
        return "float", optional  # an unannotated number: any finite number
    return None, optional


def _problem(parameter: inspect.Parameter, value: Any) -> str | None:
    kind, optional = _expects(parameter)
    if kind is None or (value is None and optional):
        return None
    either = " or null" if optional else ""
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer{either}"
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number{either}"
    if not math.isfinite(value):
        return "must be a finite number"
    return None
