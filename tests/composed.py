"""Hydra's composition of ``conf/config.yaml`` done once per distinct override list in a test process.

:func:`fedsim.cli.run.compose` is the real thing, but each call recomposes every group from the files (a tenth of a
second on the 2-core machine), and the configuration tests compose the same override lists again and again (a
strategy's defaults for its keys, then for its values; a data option to learn its reader, then to read its files).
:func:`composed` returns a deep copy of the first composition of the same list (a copy costs about 2 ms), so a test
may change what it gets. What Hydra refuses is not kept: each call with a bad list composes again and raises.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence

from omegaconf import DictConfig

from fedsim.cli.run import compose


@functools.cache
def _first_composition(overrides: tuple[str, ...]) -> DictConfig:
    return compose(list(overrides))


def composed(overrides: Sequence[str] = ()) -> DictConfig:
    """``compose(overrides)`` (fedsim.cli.run), from the process's first composition of the same list: a copy."""
    return copy.deepcopy(_first_composition(tuple(overrides)))
