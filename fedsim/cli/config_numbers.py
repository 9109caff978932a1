"""Numbers and flags in the group sections (data, partition, model, client, strategy, executor, tracker, clock, dp,
attack, secagg) checked against the constructor they are meant for, before any work.

A group section names its class or function in ``_target_``; each key is one of its parameters. Where the
parameter is annotated (or defaults to) a number, the value must be one: an ``int`` parameter takes an
integer, a ``float`` one any finite number; NaN, ±inf, strings and booleans are refused with one line that
names the field's full dotted name. A ``bool`` parameter takes only ``true`` or ``false`` (``no`` is the string
"no", which Python would take as true). ``null`` passes only where the parameter accepts ``None``. This covers
your own classes plugged in with ``_target_`` as well as fedsim's and torch's (``client.optimizer.lr``).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from fedsim.core.checks import is_integer, is_number

GROUPS = (
    *("data", "partition", "model", "adapter", "client", "strategy", "executor", "tracker", "clock", "dp", "attack"),
    "secagg",
)


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
    """The parameters of ``_target_`` by name; none when it cannot be imported (:func:`target_problem` says why)."""
    if not isinstance(target, str):
        return {}
    try:
        return dict(inspect.signature(locate(target)).parameters)
    except Exception:  # noqa: BLE001 - an unimportable target is target_problem's to report
        return {}


def locate(target: str) -> Any:
    """The object a ``_target_`` names, found the way Hydra's instantiate finds it (the first part imported, then
    each next part an attribute, else a submodule). Raises ``ImportError`` with one line saying what is missing
    (``hydra.utils.get_object`` logs the error and raises three lines)."""
    parts = target.split(".")
    if not all(parts):
        raise ImportError(f"{target!r} is not a dotted path such as package.module.Class")
    found: Any = _import(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        if hasattr(found, part):
            found = getattr(found, part)
        elif inspect.ismodule(found):
            found = _import(".".join(parts[: i + 1]))
        else:
            raise ImportError(f"{'.'.join(parts[:i])} has no attribute {part}")
    return found


def _import(name: str) -> Any:
    """``import_module(name)``; an ``ImportError`` of one line when ``name`` is not a module or fails to import."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name == name:
            raise ImportError(f"no module named {name}") from None
        raise ImportError(f"importing {name} failed: {_first_line(error)}") from None
    except Exception as error:  # noqa: BLE001 - the module itself fails to import: say how, in one line
        raise ImportError(f"importing {name} failed: {type(error).__name__}: {_first_line(error)}") from None


def target_problem(target: Any) -> str | None:
    """Why ``_target_`` cannot be imported (one line), or ``None`` when it can (or is not a string)."""
    if not isinstance(target, str):
        return None
    try:
        locate(target)
    except ImportError as error:
        return str(error)
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _expects(parameter: inspect.Parameter) -> tuple[str | None, bool]:
    """("int" | "float" | "bool" | None, whether None is accepted) from the annotation, else from the default."""
    annotation = parameter.annotation if parameter.annotation is not inspect.Parameter.empty else ""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    text = text.replace(" ", "")
    default = parameter.default
    optional = "None" in text or "Optional" in text or default is None
    if text in ("int", "int|None", "Optional[int]", "None|int"):
        return "int", optional
    if "float" in text:
        return "float", optional
    if text in ("bool", "bool|None", "Optional[bool]", "None|bool") or (not text and isinstance(default, bool)):
        return "bool", optional
    if not text and isinstance(default, (int, float)) and not isinstance(default, bool):
        return "float", optional  # an unannotated number: any finite number
    return None, optional


def _problem(parameter: inspect.Parameter, value: Any) -> str | None:
    kind, optional = _expects(parameter)
    if kind is None or (value is None and optional):
        return None
    either = " or null" if optional else ""
    if kind == "bool":
        return None if isinstance(value, bool) else f"must be true or false{either}"
    if kind == "int":
        return None if is_integer(value) else f"must be an integer{either}"
    if not is_number(value, finite=False):
        return f"must be a number{either}"
    return None if is_number(value) else "must be a finite number"
