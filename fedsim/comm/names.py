"""Codecs by name, for ``compression.uplink`` / ``compression.downlink`` lists in configs.

An entry is a name (``fp16``), a name with arguments (``{name: qsgd, bits: 2}``) or, for your own codec, a dict with
``_target_`` (a :class:`~fedsim.comm.Sparsifier` or :class:`~fedsim.comm.ValueCodec`), which the composition root
instantiates.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from fedsim.comm.codecs import BFloat16, Float16
from fedsim.comm.pipeline import Codec
from fedsim.comm.qsgd import QSGD
from fedsim.comm.sparsify import RandomMask, TopK

CODECS: dict[str, Callable[..., Codec]] = {
    "fp16": Float16,
    "bf16": BFloat16,
    "qsgd": QSGD,
    "topk": TopK,
    "random_mask": RandomMask,
}


def codec_from(entry: Any, where: str, instantiate: Callable[[Mapping[str, Any]], Any]) -> Any:
    """The codec an entry names; a ``ValueError`` naming ``where`` for an unknown name or bad arguments."""
    if isinstance(entry, Mapping) and "_target_" in entry:
        return instantiate(entry)
    name, kwargs = (
        (entry, {})
        if isinstance(entry, str)
        else (_name(entry, where), {k: v for k, v in entry.items() if k != "name"})
    )
    if name not in CODECS:
        raise ValueError(f"{where}: unknown codec {name!r}; use one of {', '.join(CODECS)} or a dict with _target_")
    try:
        return CODECS[name](**kwargs)
    except TypeError as error:  # an unknown or missing argument
        detail = re.sub(r"^[\w.]*__init__[(][)] ", "", str(error))
        raise ValueError(f"{where}: {name} {detail}") from None
    except ValueError as error:  # a value out of range
        raise ValueError(f"{where}: {error}") from None


def _name(entry: Any, where: str) -> str:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
        raise ValueError(
            f"{where}: expected a codec name (e.g. fp16) or a dict with `name` or `_target_` (got {entry!r})"
        )
    return entry["name"]
