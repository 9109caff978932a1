"""A sweep's keys checked against each swept option before any job runs, not against the group's default.

Hydra composes a sweep's own configuration (its ``hydra`` settings, ``multirun.yaml``) from the command line
without its sweeps, so every swept group is at its default there: ``-m adapter=lora,ffa_lora adapter.r=4`` stops
before any job with "Could not override 'adapter.r'", because ``adapter=none`` has no ``r``, although every job
has it (hydra-core 1.3 calls this expected, hydra issues #283 and #2888). So, before Hydra starts a sweep:

* each option of each swept group is composed with the command line's other overrides (the other swept groups at
  their first option, value sweeps at their first value): an override that one option cannot take stops the
  command in one line naming that option, before any job;
* where the defaults cannot take the overrides but every swept option can, each swept group's first option is put
  on the command line just before its sweep (``adapter=lora adapter=lora,ffa_lora``): Hydra composes the sweep's
  configuration from it, and the jobs are unchanged (a later override of a key replaces an earlier one; their
  ``.hydra/overrides.yaml`` and directory names are those of the plain sweep). ``multirun.yaml`` records the
  extra override.

A mistake that every job shares (``num_round=3``) is the line a single run would give. Only the basic command line
is checked: with ``--config-name``, ``--config-dir``, ``--config-path`` or another Hydra flag, or with
``hydra.searchpath``, Hydra has the command line as it was given.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from fedsim.core.errors import ConfigError

_MULTIRUN = ("-m", "--multirun")
_OTHER_CONFIGS = ("hydra.searchpath", "+hydra.searchpath", "++hydra.searchpath")  # groups this check cannot see
_CANNOT_OVERRIDE = re.compile(r"Could not override '([^']+)'")


@dataclass
class _Sweep:
    """The command line's overrides, as a sweep sees them."""

    fixed: list[str] = field(default_factory=list)  # the overrides that are not sweeps
    first_values: list[str] = field(default_factory=list)  # each value sweep at its first value
    groups: dict[str, list[str]] = field(default_factory=dict)  # each swept group's options, in sweep order
    group_args: dict[str, str] = field(default_factory=dict)  # the command-line argument of each group's sweep


def sweep_arguments(argv: Sequence[str]) -> list[str]:
    """``argv`` (the arguments after the program name) as Hydra should get them: unchanged for a single run, or
    with the first swept options put before their sweeps where the defaults cannot take the overrides. Raises
    :class:`ConfigError` (one line naming the option) when an override does not fit one of the swept options."""
    argv = list(argv)
    if not any(arg in _MULTIRUN for arg in argv) or any(
        (arg.startswith("-") and arg not in _MULTIRUN) or arg.startswith(_OTHER_CONFIGS) for arg in argv
    ):
        return argv
    try:
        sweep = _read_sweep([arg for arg in argv if not arg.startswith("-")])
    except Exception:  # noqa: BLE001 - an override Hydra cannot read: Hydra's own check reports it
        return argv
    if not sweep.groups:
        return argv
    failures = _failures(sweep)
    lines = {line for _, line in failures.values()}
    if len(failures) == len(_probes(sweep)) and len(lines) == 1:
        raise ConfigError(lines.pop())  # every job fails alike: not the swept options' doing, no option named
    if failures:
        raise ConfigError(_refusal(sweep, failures))
    if _composes(sweep.fixed):
        return argv
    pinned = []
    for arg in argv:
        group = next((g for g, a in sweep.group_args.items() if a == arg), None)
        if group is not None:
            pinned.append(f"{group}={sweep.groups[group][0]}")
        pinned.append(arg)
    return pinned


def _read_sweep(overrides: list[str]) -> _Sweep:
    """The overrides parsed as Hydra's basic sweeper parses them (a glob over a group's options included)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from fedsim.cli.run import CONFIG_DIR

    sweep = _Sweep()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        for override in OverridesParser.create(config_loader=loader).parse_overrides(overrides):
            if override.is_hydra_override():
                continue
            key = override.get_key_element()
            if not override.is_sweep_override():  # as the basic sweeper writes it into every job's overrides
                sweep.fixed.append(f"{key}={override.get_value_element_as_str()}")
            elif override.is_discrete_sweep():
                values = list(override.sweep_string_iterator())
                if loader.get_group_options(override.key_or_group):  # a config group: its options
                    sweep.groups[key], sweep.group_args[key] = values, str(override.input_line)
                elif values:
                    sweep.first_values.append(f"{key}={values[0]}")
    return sweep


def _choices(sweep: _Sweep, group: str, option: str) -> dict[str, str]:
    """The swept groups' options in the job with ``group=option`` and every other swept group at its first."""
    choices = {g: options[0] for g, options in sweep.groups.items() if options}
    choices[group] = option
    return choices


def _probe(choices: dict[str, str], sweep: _Sweep) -> tuple[str, ...]:
    """The overrides of the job with the swept groups at ``choices``."""
    return (*sweep.fixed, *sweep.first_values, *(f"{g}={o}" for g, o in choices.items()))


def _probes(sweep: _Sweep) -> dict[tuple[str, ...], dict[str, str]]:
    """One job for each option of each swept group, the other groups at their first option (each job once)."""
    jobs: dict[tuple[str, ...], dict[str, str]] = {}
    for group, options in sweep.groups.items():
        for option in options:
            choices = _choices(sweep, group, option)
            jobs.setdefault(_probe(choices, sweep), choices)
    return jobs


def _failures(sweep: _Sweep) -> dict[tuple[str, ...], tuple[str, str]]:
    """``job's overrides -> (Hydra's error text, fedsim's line for it)`` for each job of :func:`_probes` that cannot
    be composed."""
    from fedsim.cli.override_errors import override_error_line

    failures = {}
    for overrides in _probes(sweep):
        try:
            _compose(list(overrides))
        except Exception as error:  # noqa: BLE001 - whatever composition refuses, named below
            line = override_error_line(error, overrides) or str(error).strip().splitlines()[0]
            failures[overrides] = (str(error), line)
    return failures


def _refusal(sweep: _Sweep, failures: dict[tuple[str, ...], tuple[str, str]]) -> str:
    """The one line for the first job that failed: an override under a swept group that the job's option has no
    key for names that option and the swept options that have it; anything else is composition's own line, with
    the job's swept options."""
    jobs = _probes(sweep)
    overrides, (text, line) = next(iter(failures.items()))
    choices = jobs[overrides]
    key = _CANNOT_OVERRIDE.search(text)
    group = next((g for g in choices if key is not None and key.group(1).startswith(g + ".")), None)
    if key is None or group is None:
        return f"{line} (in the sweep's jobs with {', '.join(f'{g}={o}' for g, o in choices.items())})"
    having = [o for o in sweep.groups[group] if _probe(_choices(sweep, group, o), sweep) not in failures]
    return (
        f"unknown setting {key.group(1)} in the sweep's jobs with {group}={choices[group]} (that option has no "
        f"{key.group(1)[len(group) + 1 :]}; the swept options that have it: {', '.join(having) or 'none'}): sweep "
        f"{group} over the options that take it"
    )


def _composes(overrides: list[str]) -> bool:
    try:
        _compose(overrides)
    except Exception:  # noqa: BLE001 - Hydra's sweep-level composition would fail the same way
        return False
    return True


def _compose(overrides: list[str]) -> None:
    from fedsim.cli.run import compose

    compose(overrides)
