"""One composition per command instead of two: hydra-core 1.3's ``_run_hydra`` composes the whole configuration
once only to read ``hydra.mode`` (``Hydra.get_mode``, a private method), then again to run the job or the sweep.
That first composition is ~0.06 s of CPU (a fifth of a short run from the command line).

fedsim's ``conf/`` never sets ``hydra.mode`` (tests/cli/test_hydra_mode.py reads every file), and Hydra's own
default is ``None``; so a command line that neither sets it nor brings in configs from elsewhere (a Hydra flag other
than ``-m``, ``hydra.searchpath``, a ``hydra/...`` group such as a sweeper or launcher) has ``None`` as its mode.
:func:`mode_read_from_the_command_line` answers that without composing; any other command line goes Hydra's way.
Where ``Hydra.get_mode`` is not there (another hydra-core), nothing changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

_MULTIRUN = ("-m", "--multirun")
_MODE_SOURCES = ("hydra.mode", "hydra.searchpath", "hydra/")  # overrides that set the mode or bring in other configs


def mode_is_unset(argv: Sequence[str]) -> bool:
    """Whether the command line ``argv`` (the arguments after the program name) leaves ``hydra.mode`` as fedsim's
    ``conf/`` has it: unset."""
    return not any(
        (arg.startswith("-") and arg not in _MULTIRUN) or arg.lstrip("+~").startswith(_MODE_SOURCES) for arg in argv
    )


@contextlib.contextmanager
def mode_read_from_the_command_line(argv: Sequence[str]) -> Iterator[None]:
    """Inside, Hydra takes the mode of ``argv`` as unset without composing the configuration for it, when
    :func:`mode_is_unset` says so (its ``_run_hydra`` then runs a job, or a sweep with ``-m``, as it would have)."""
    hydra_class = _hydra_class()
    original = getattr(hydra_class, "get_mode", None)
    if original is None or not mode_is_unset(argv):
        yield
        return

    def unset_mode(self: Any, config_name: str | None, overrides: list[str]) -> None:
        return None

    hydra_class.get_mode = unset_mode
    try:
        yield
    finally:
        hydra_class.get_mode = original


def _hydra_class() -> Any:
    try:
        from hydra._internal.hydra import Hydra
    except ImportError:
        return None
    return Hydra
