"""Short run names for the jobs of a sweep: what varies first.

TensorBoard names a run by its directory below ``--logdir``, and a sweep job's directory is Hydra's
``<job>_<hydra.job.override_dirname>``: every override, sorted by key, so the swept setting can sit behind a dozen
fixed ones and be cut off in the run selector. :func:`sweep_run_label` orders the job's overrides instead as the
sweep's parameters (in the order they were given), then the other overrides with their keys shortened to the
last part (``client.optimizer.foreach=true`` -> ``foreach=true``; the whole key where two last parts clash),
all as ``key=value`` joined by ``,`` so that the run selector's regex filter (``strategy=fedprox``) still works.
A label longer than :data:`MAX_LABEL_BYTES` keeps the entries that fit and ends with a digest of the whole
(:func:`fit_label`): a name never breaks a run (a directory name holds at most 255 bytes), and the full overrides
stay in the job's ``.hydra/overrides.yaml``, where ``python -m fedsim.report`` reads them.

The sweep's parameters are the overrides of the sweep's command line that are sweeps (``a=1,2``, ``range(...)``,
``choice(...)``), recorded by Hydra in ``<sweep dir>/multirun.yaml``, and the keys of ``hydra.sweeper.params``.
:func:`register_run_label_resolver` makes it available to Hydra's configuration as ``${fedsim_run_label:}``, e.g.
``hydra.sweep.subdir: ${hydra:job.num}_${fedsim_run_label:}``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from fedsim.observe.tensorboard_log import NOT_SHOWN

RESOLVER = "fedsim_run_label"
MAX_LABEL_BYTES = 200
"""A label's longest UTF-8 encoding: with the job number and ``_`` before it, a directory name stays within the
255 bytes a filesystem allows for one name, and TensorBoard's and the trackers' run names (the directory) stay short."""


def sweep_run_label(job_overrides: Sequence[str], swept: Iterable[str], exclude: Iterable[str] = ()) -> str:
    """The name of one job: its overrides (``key=value``, ``+`` and ``++`` dropped), those of the keys ``swept``
    first in that order, then the rest with shortened keys; the keys ``exclude`` names, or whose first part it
    names (``logger`` for ``logger.progress``), are left out, and deletions (``~key``). A ``/`` in a value becomes
    ``_`` (it would make a sub-directory)."""
    left_out = set(exclude)
    settings = dict(_key_value(o) for o in job_overrides if not o.startswith("~") and "=" in o)
    settings = {
        k: v.replace("/", "_") for k, v in settings.items() if k not in left_out and k.split(".")[0] not in left_out
    }
    varying = [k for k in dict.fromkeys(swept) if k in settings]
    fixed = [k for k in settings if k not in varying]
    last = [k.rsplit(".", 1)[-1] for k in fixed]
    short = [part if last.count(part) == 1 else key for key, part in zip(fixed, last, strict=True)]
    return fit_label(
        [f"{k}={settings[k]}" for k in varying] + [f"{s}={settings[k]}" for k, s in zip(fixed, short, strict=True)]
    )


def fit_label(entries: Sequence[str], limit: int = MAX_LABEL_BYTES) -> str:
    """``entries`` joined by ``,`` if that takes at most ``limit`` bytes (UTF-8); else the whole entries that fit
    and ``,+<n>_more_<digest>`` for the ``n`` left out, ``<digest>`` the first 10 hex digits of the SHA-256 of the
    whole label (the same overrides give the same name); an entry too long on its own is cut (at a character) and
    ends with ``...``."""
    label = ",".join(entries)
    if len(label.encode()) <= limit:
        return label
    digest = hashlib.sha256(label.encode()).hexdigest()[:10]
    for kept in range(len(entries) - 1, 0, -1):
        head, tail = ",".join(entries[:kept]), f",+{len(entries) - kept}_more_{digest}"
        if len((head + tail).encode()) <= limit:
            return head + tail
    tail = f"...,+{len(entries) - 1}_more_{digest}" if len(entries) > 1 else f"..._{digest}"
    cut = entries[0].encode()[: limit - len(tail)].decode(errors="ignore")  # a split character is dropped
    return cut + tail


def swept_keys(sweep_overrides: Sequence[str], sweeper_params: Iterable[str] = ()) -> list[str]:
    """The keys a sweep varies: its command-line overrides that are sweeps (parsed as Hydra parses them), then the
    keys of ``hydra.sweeper.params``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(sweep_overrides))
    return list(dict.fromkeys([o.key_or_group for o in parsed if o.is_sweep_override()] + list(sweeper_params)))


def hydra_run_label() -> str:
    """:func:`sweep_run_label` of the Hydra job being set up (for ``${fedsim_run_label:}``): the job's overrides,
    the sweep's from ``<hydra.sweep.dir>/multirun.yaml`` (without that file, only ``hydra.sweeper.params`` are
    known as swept); left out are the keys ``hydra.job.config.override_dirname.exclude_keys`` leaves out of
    Hydra's name and the output and restart settings that HParams leaves out too (``logger``, ``resume``, ...)."""
    from hydra.core.hydra_config import HydraConfig

    hydra = HydraConfig.get()
    recorded = _read_yaml(Path(str(hydra.sweep.dir)) / "multirun.yaml")
    sweep_overrides = _select(recorded, "hydra", "overrides", "task") or []
    params = hydra.sweeper.get("params") or {}
    swept = swept_keys([str(o) for o in sweep_overrides], [str(k) for k in params])
    exclude = [*(str(k) for k in hydra.job.config.override_dirname.exclude_keys), *NOT_SHOWN]
    return sweep_run_label([str(o) for o in hydra.overrides.task], swept, exclude)


def register_run_label_resolver() -> None:
    """Make ``${fedsim_run_label:}`` (:func:`hydra_run_label`) available to Hydra's configuration (once)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, hydra_run_label, use_cache=False)


def _key_value(override: str) -> tuple[str, str]:
    key, value = override.split("=", 1)
    return key.lstrip("+"), value


def _select(tree: Any, *keys: str) -> Any:
    for key in keys:
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
