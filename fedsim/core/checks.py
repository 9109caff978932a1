"""The value checks every package writes its settings' refusals with: one ``ValueError`` of one line that names the
key, says what it takes and shows what it got.

* :func:`integer`: ``<key> must be an integer >= 1 (got 2.5)``, or ``... between 2 and 8 (got 9)``;
* :func:`number`: ``<key> must be a finite number > 0 (got nan)``, ``... >= 0 ...``, ``... > 0 (or inf) ...``, or
  ``... a finite number ...``;
* :func:`within`: ``<key> must be in [0, 1) (got 1.0)``, for any interval written as it reads in the message.

Each returns the value as a plain ``int`` or ``float`` when it passes. ``key`` is the setting as the user writes it
(``strategy.mu``, ``data.num_devices``); ``hint`` is appended to the message as it is (``": the weight of ..."``).
A bool is never a number here (Python counts ``True`` as the integer 1), NaN and ±inf are never finite, and numpy
scalars pass like the Python numbers they hold. :func:`is_integer` and :func:`is_number` are the tests alone, for
checks whose message says more.
"""

from __future__ import annotations

import functools
import math
import re
from numbers import Integral, Real
from typing import TypeGuard

_INTERVAL = re.compile(r"^([\[(])\s*([^,\s]+)\s*,\s*([^\]\s)]+)\s*([\])])$")


def is_integer(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an ``int`` or a numpy integer, and not a ``bool``."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def is_number(value: object, *, finite: bool = True) -> TypeGuard[float]:
    """Whether ``value`` is a real number (``int``, ``float``, numpy scalars; not a ``bool``), and finite unless
    ``finite=False``."""
    return isinstance(value, Real) and not isinstance(value, bool) and (not finite or math.isfinite(value))


def integer(key: str, value: object, lowest: int, highest: int | None = None, *, hint: str = "") -> int:
    """``value`` as an ``int`` when it is an integer in ``lowest..highest`` (no upper bound by default); else a
    ``ValueError``: "``<key> must be an integer >= <lowest> (got <value>)<hint>``" (``between <lowest> and
    <highest>`` with an upper bound)."""
    if is_integer(value) and lowest <= value and (highest is None or value <= highest):
        return int(value)
    bound = f">= {lowest}" if highest is None else f"between {lowest} and {highest}"
    raise ValueError(f"{key} must be an integer {bound} (got {value!r}){hint}")


def number(
    key: str,
    value: object,
    *,
    above: float | None = None,
    at_least: float | None = None,
    allow_inf: bool = False,
    hint: str = "",
) -> float:
    """``value`` as a ``float`` when it is a finite number ``> above`` (or ``>= at_least``; any finite number when
    neither is given), or +inf with ``allow_inf``; else a ``ValueError``: "``<key> must be a finite number > <above>
    (got <value>)<hint>``" (``(or inf)`` after the bound with ``allow_inf``)."""
    if above is not None and at_least is not None:
        raise TypeError("number() takes above or at_least, not both")
    if allow_inf and is_number(value, finite=False) and value == math.inf:
        return math.inf
    if is_number(value) and (above is None or value > above) and (at_least is None or value >= at_least):
        return float(value)
    bound = f" > {above:g}" if above is not None else f" >= {at_least:g}" if at_least is not None else ""
    raise ValueError(f"{key} must be a finite number{bound}{' (or inf)' if allow_inf else ''} (got {value!r}){hint}")


def within(key: str, value: object, interval: str, *, hint: str = "") -> float:
    """``value`` as a ``float`` when it is a number in ``interval``, written as the message shows it: ``"[0, 1)"``,
    ``"(0, 1]"``, ``"[0, 0.5)"`` (square bracket: the bound is included); else a ``ValueError``: "``<key> must be in
    <interval> (got <value>)<hint>``". NaN is in no interval."""
    closed_low, low, high, closed_high = _bounds(interval)
    if is_number(value, finite=False):
        above_low = value >= low if closed_low else value > low
        below_high = value <= high if closed_high else value < high
        if above_low and below_high:
            return float(value)
    raise ValueError(f"{key} must be in {interval} (got {value!r}){hint}")


@functools.cache
def _bounds(interval: str) -> tuple[bool, float, float, bool]:
    """``"[0, 1)"`` → ``(True, 0.0, 1.0, False)``: whether each end is included, and the ends."""
    match = _INTERVAL.match(interval)
    if match is None:
        raise ValueError(f"within: {interval!r} is not an interval such as [0, 1) or (0, 1]")
    opening, low, high, closing = match.groups()
    return opening == "[", float(low), float(high), closing == "]"
