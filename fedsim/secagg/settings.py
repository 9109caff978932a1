"""The secure-aggregation stage's settings checked before any work: each bad value refused in one line that names
its key (``secagg.<key>``), as the command line spells it."""

from __future__ import annotations

import math
from numbers import Real

from fedsim.secagg.ddp import DistributedDP

PROTOCOLS = ("secagg", "secagg_plus")


def _check(name: str, ok: bool, rule: str, value: object, hint: str = "") -> None:
    """Refuse, in one line naming ``secagg.<name>``, a value for which ``ok`` is false."""
    if not ok:
        raise ValueError(f"secagg.{name} must be {rule} (got {value!r}){'; ' + hint if hint else ''}")


def _within(
    value: object, low: float, high: float = math.inf, *, low_open: bool = True, high_open: bool = True
) -> bool:
    """Whether ``value`` is a finite real number (not a bool) in the interval from ``low`` to ``high``."""
    if not isinstance(value, Real) or isinstance(value, bool) or not math.isfinite(float(value)):
        return False
    x = float(value)
    return (x > low if low_open else x >= low) and (x < high if high_open else x <= high)


def check_settings(
    *,
    protocol: object,
    bits: object,
    clip: object,
    scale: object,
    threshold: object,
    dropout: object,
    rotation: object,
    degree: object,
    scale_sigmas: object,
    dp: object,
) -> None:
    """Refuse the first bad setting of :class:`~fedsim.secagg.SecureAggregation` (its docstring says what each is)."""
    _check("protocol", protocol in PROTOCOLS, f"one of {', '.join(PROTOCOLS)}", protocol)
    _check("bits", isinstance(bits, int) and not isinstance(bits, bool) and 8 <= bits <= 32, "in [8, 32]", bits)
    _check("clip", _within(clip, 0), "a finite number > 0", clip, "the L2 bound on each update")
    _check("scale", scale is None or _within(scale, 0), "> 0 or null (derived)", scale)
    _check("threshold", _within(threshold, 0, 1, high_open=False), "in (0, 1]", threshold)
    _check("dropout", _within(dropout, 0, 1, low_open=False), "in [0, 1)", dropout)
    _check("rotation", isinstance(rotation, bool), "true or false", rotation)
    even = isinstance(degree, int) and not isinstance(degree, bool) and degree >= 2 and degree % 2 == 0
    _check("degree", degree is None or even, "an even integer >= 2 or null (of order log n)", degree)
    _check("degree", degree is None or protocol == "secagg_plus", "null with secagg=secagg", degree, "SecAgg+ only")
    _check("scale_sigmas", scale_sigmas is None or _within(scale_sigmas, 0), "> 0 or null", scale_sigmas)
    _check("dp", dp is None or isinstance(dp, DistributedDP), "a fedsim.secagg.DistributedDP or null", dp)
