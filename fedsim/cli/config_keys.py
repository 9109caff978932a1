"""Unknown keys refused before any work, with a "did you mean": a typo must never run silently.

Hydra refuses a key the configuration does not have (``num_round=3``) and suggests ``+num_round=3``, which
adds it; fedsim would then ignore it (a run-level key) or fail deep inside a constructor (a group key). So
after composition every run-level key must be a field of :class:`~fedsim.cli.config.RunSchema`, every
``_target_`` importable, and every key of a group section a parameter of the ``_target_`` it configures (unless
that takes ``**kwargs``).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import fields
from typing import cast

from omegaconf import DictConfig

from fedsim.cli.config_numbers import GROUPS, parameters, target_problem


def did_you_mean(key: str, known: Iterable[str], prefix: str = "") -> str:
    """``"; did you mean <prefix>X?"`` for the closest of ``known`` to ``key``, else ``""``."""
    names = sorted(set(known))
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return f"; did you mean {prefix}{close[0]}?" if close else ""


def check_keys(cfg: DictConfig, schema: type, error: Callable[[str], Exception]) -> None:
    """Raise ``error(line)`` for the first key of ``cfg`` that nothing reads."""
    known = [f.name for f in fields(schema)]
    for key in cast("Iterable[object]", cfg):  # keys print as they are (the stub's key type has bytes)
        if str(key) not in known:
            raise error(
                f"unknown setting {key}{did_you_mean(str(key), known)} (fedsim reads no such key; "
                "the run-level keys are listed in conf/config.yaml)"
            )
    for group in GROUPS:
        node = cfg.get(group)
        if isinstance(node, DictConfig):
            check_section(node, group, error)


def check_section(node: DictConfig, path: str, error: Callable[[str], Exception]) -> None:
    """Raise ``error(line)`` for a ``_target_`` of the section ``path`` (or of a section inside it) that cannot be
    imported, or a key that its ``_target_`` does not take."""
    target = node.get("_target_")
    problem = target_problem(target)
    if problem is not None:
        raise error(
            f"{path}._target_={target} cannot be imported ({problem}); check the spelling, or put the folder of "
            "your own module on PYTHONPATH"
        )
    accepted = parameters(target)
    open_ended = not accepted or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    for key in node:
        key = str(key)
        if key.startswith("_"):
            continue
        value = node.get(key)
        if isinstance(value, DictConfig) and "_target_" in value:
            check_section(value, f"{path}.{key}", error)
        if not open_ended and key not in accepted:
            names = [name for name in accepted if not name.startswith("_")]
            raise error(
                f"unknown setting {path}.{key}{did_you_mean(key, names, path + '.')} ({target} takes "
                f"{', '.join(names)})"
            )
