"""The one check that a dataset holds no NaN or infinity, which every reader calls before training starts.

A NaN feature or label does not stop training: it turns the model's weights into NaN, and the run goes on to an
accuracy of 0.0 or a meaningless one. So the readers refuse such data at load, in one line naming where the value is
(the file, the client that owns the row, the row). Only floating-point values are looked at: integer tensors (token
ids, labels) cannot hold NaN and cost nothing. The test reads the values once and allocates nothing: a tensor's sum
(NaN or infinite when any value is), a numpy array's largest and smallest value (NaN propagates into both). Only when
it fails are the rows searched for the first bad one (a sum that overflowed although every value is finite is then
found to be fine). Its cost, one read of the data at memory speed, is measured against loading in docs/performance.md
("The finite check of the data").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

Values = torch.Tensor | np.ndarray
"""Features or labels, one row per example (any shape after the first axis)."""

_SEARCH_ROWS = 1 << 14
"""Rows searched at a time for the first bad one (bounds the search's boolean mask)."""


class NonFiniteDataError(ValueError):
    """A dataset holds NaN or infinity; the message is one line naming the file, client and row."""


def check_finite(
    values: Values,
    name: str,
    *,
    source: str | None = None,
    owners: Any = None,
    rows: Sequence[int] | np.ndarray | Callable[[int], int] | None = None,
    remedy: str = "fix or drop that row",
) -> None:
    """Raise :class:`NonFiniteDataError` when a value of ``values`` is NaN or infinite; integer values pass at once.

    ``name`` names the values (``x_train``, ``pixels``, ``column 'features'``); ``source`` is where they were read
    (a file); ``owners`` the client of every row (an array with one entry per row), of all rows (one value), or a
    function of the row; ``rows`` the row number to name for every row of ``values`` (an array, or a function of
    the row; default: its own index). The functions are called only for a bad row. The message::

        data: <source>: <name> has a non-finite value (nan) at row <row> (client <owner>); <remedy>
    """
    if not _is_float(values) or _quick_all_finite(values):
        return
    found = _first_non_finite(values)
    if found is None:  # the sum overflowed, but every value is finite
        return
    row, value = found
    where = f"{source}: " if source else ""
    shown = row if rows is None else int(rows(row) if callable(rows) else rows[row])
    client = "" if owners is None else f" (client {_owner(owners, row)})"
    raise NonFiniteDataError(f"data: {where}{name} has a non-finite value ({value}) at row {shown}{client}; {remedy}")


def _is_float(values: Values) -> bool:
    if isinstance(values, torch.Tensor):
        return values.is_floating_point()
    return values.dtype.kind == "f"


def _quick_all_finite(values: Values) -> bool:
    """True when every value is finite; False when one is not, or (rarely) when a tensor's sum overflows. A tensor:
    its sum (one read, on torch's threads), which any NaN or infinity makes non-finite (no finite value cancels
    one). A numpy array (the readers pass small ones: one user's or one device's rows, labels): its largest and
    smallest value, on this thread (waking torch's threads for each of thousands of small arrays costs more)."""
    if isinstance(values, torch.Tensor):
        return bool(torch.isfinite(values.sum()))
    return values.size == 0 or bool(np.isfinite(values.max()) and np.isfinite(values.min()))


def _first_non_finite(values: Values) -> tuple[int, str] | None:
    """The first row holding a non-finite value and that value (``nan``, ``inf``, ``-inf``), or ``None``."""
    if isinstance(values, torch.Tensor):
        tensor = values.detach().cpu()
        arr = (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()
    else:
        arr = values
    table = arr.reshape(arr.shape[0] if arr.ndim else 1, -1)
    for start in range(0, table.shape[0], _SEARCH_ROWS):
        bad = ~np.isfinite(table[start : start + _SEARCH_ROWS])
        hit = np.flatnonzero(bad.any(axis=1))
        if hit.size:
            row = int(hit[0])
            value = table[start + row][bad[row]][0]
            return start + row, str(float(value))
    return None


def _owner(owners: Any, row: int) -> str:
    """The owner of ``row``: a string quoted, a number as it is."""
    owner = owners(row) if callable(owners) else owners[row] if np.ndim(owners) else owners
    if isinstance(owner, (np.generic, torch.Tensor)):
        owner = owner.item()
    return repr(owner) if isinstance(owner, str) else str(owner)
