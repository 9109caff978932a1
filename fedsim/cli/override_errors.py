"""Hydra's refusals of a command-line override, as one line with a "did you mean" or the values the key takes.

Hydra answers ``num_round=3`` with four lines ending in the advice to write ``+num_round=3`` (which adds a
key nothing reads), ``strategy=fedadamm`` with the list of every option, and ``seed=abc`` with OmegaConf's five
lines about ``object_type=RunSchema``. fedsim says instead which key or option is unknown and the closest known
one, or what the key takes (``seed must be an integer >= 0 (got abc)``), and exits with status 2 (bad input)."""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra.errors import OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import ValidationError

from fedsim.cli.config_keys import did_you_mean

_CANNOT_OVERRIDE = re.compile(r"Could not override '([^']+)'")
_NO_OPTION = re.compile(r"Could not find '([^'/]+)/([^']+)'")
_MERGING = re.compile(r"^Error merging override ([+~]*)([^=\s]+)=(.*)$")


def override_error_line(error: BaseException, argv: Sequence[str] | None = None) -> str | None:
    """The one line for a Hydra composition ``error`` caused by an unknown key or option, else ``None``."""
    if isinstance(error, OverrideParseException):
        return unreadable_override_line(error)
    text = str(error)
    argv = list(sys.argv[1:] if argv is None else argv)
    unknown_key = _CANNOT_OVERRIDE.search(text)
    if unknown_key:
        return unknown_key_line(unknown_key.group(1), argv)
    unknown_option = _NO_OPTION.search(text)
    if unknown_option:
        return unknown_option_line(*unknown_option.groups())
    merging = _MERGING.match(text)
    if merging and isinstance(error.__cause__, ValidationError):  # the schema refused the value's type
        return wrong_type_line(merging.group(2), merging.group(3), error.__cause__)
    return None


def unreadable_override_line(error: OverrideParseException) -> str:
    """``cannot read the override a=x(y (...)``: Hydra's grammar refused it (unquoted brackets, parentheses, ``=``
    or ``$`` in a value, e.g. a regular expression); Hydra's own report is three lines and exit status 1."""
    first = error.message.strip().splitlines()[0] if error.message.strip() else "a syntax error"
    return (
        f"cannot read the override {error.override} ({first}); quote a value holding brackets, parentheses, = or $ "
        "for Hydra, inside the shell's quotes: \"key='value'\""
    )


def wrong_type_line(key: str, value: str, error: BaseException) -> str:
    """``seed must be an integer >= 0 (got abc)``: what the schema field ``key`` takes (its type and range); for a
    key the schema does not describe, the first line of OmegaConf's ``error``."""
    from fedsim.cli.config import schema_rule

    rule = schema_rule(key)
    if rule is None:
        return f"{key}={value}: {str(error).strip().splitlines()[0]}"
    return f"{key} must be {rule} (got {value})"


def unknown_key_line(key: str, argv: Sequence[str]) -> str:
    """``unknown setting a.b; did you mean a.c? ...``: the known keys are those of ``a`` as the other overrides
    compose it, and the parameters of its ``_target_``. Where that ``_target_`` is not fedsim's own class but one
    that takes ``b`` (by name or ``**kwargs``), ``+a.b=...`` is the fix, and the line says so."""
    parent, _, leaf = key.rpartition(".")
    node = _section(parent, [arg for arg in argv if not _sets(arg, key)])
    known = [str(k) for k in node if not str(k).startswith("_")] if node is not None else []
    target = node.get("_target_") if node is not None else None
    if not isinstance(target, str) or target.startswith("fedsim."):
        advice = f"a typo? `+{key}=...` would add a key that fedsim does not read"
    else:
        from fedsim.cli.config_numbers import parameters

        accepted = parameters(target)
        names = [name for name in accepted if not name.startswith("_")]
        if leaf in accepted or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
            return (
                f"unknown setting {key} ({parent}._target_ is your {target}, which takes it: add it with `+{key}=...`)"
            )
        known += names
        advice = f"{target} takes {', '.join(names) or 'no arguments'}; `+{key}=...` would add a key it does not read"
    return f"unknown setting {key}{did_you_mean(leaf, known, parent + '.' if parent else '')} ({advice})"


def unknown_option_line(group: str, option: str) -> str:
    """``no option fedadamm in group strategy; did you mean fedadam? (options: ...)``."""
    from fedsim.cli.run import CONFIG_DIR

    options = sorted(path.stem for path in (Path(CONFIG_DIR) / group).glob("*.yaml"))
    if not options:
        return (
            f"no config group {group} (groups: {', '.join(_groups(CONFIG_DIR))})"
            f"{did_you_mean(group, _groups(CONFIG_DIR))}"
        )
    return f"no option {option} in group {group}{did_you_mean(option, options)} (options: {', '.join(options)})"


def _sets(arg: str, key: str) -> bool:
    return arg.lstrip("+~").split("=", 1)[0] == key


def _groups(config_dir: str) -> list[str]:
    return sorted(path.name for path in Path(config_dir).iterdir() if path.is_dir())


def _section(parent: str, argv: Sequence[str]) -> DictConfig | None:
    """The section ``parent`` of the configuration composed from ``argv``'s overrides (``None`` if that fails)."""
    from fedsim.cli.run import compose

    overrides = [arg for arg in argv if "=" in arg and not arg.startswith(("-", "hydra."))]
    try:
        node = compose(overrides)
        for part in parent.split(".") if parent else []:
            node = node[part]
    except Exception:  # noqa: BLE001 - another override is wrong too: no suggestion then
        return None
    return node if isinstance(node, DictConfig) else None
