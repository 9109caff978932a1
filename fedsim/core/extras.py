"""Optional dependencies (the package's extras): import one, or stop in one line that says what to install.

Every feature that needs an extra (``executor=ray``, DP accounting, TFF's and Hugging Face's datasets, the MLflow
and W&B trackers) imports it through :func:`require` when it is built, so a missing package stops the run before
any work starts with the same kind of error everywhere: :class:`MissingExtraError`, a
:class:`~fedsim.cli.config.ConfigError` (so the command line prints its one line and exits 2, as for any bad
setting) and an :class:`ImportError` (so code that guards an import still catches it).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from types import ModuleType

from fedsim.core.errors import ConfigError

_after_import: list[Callable[[], None]] = []  # see after_each_import


class MissingExtraError(ConfigError, ImportError):
    """An optional package is not installed; ``str()`` is one line naming what needs it and how to install it."""


def require(module: str, needed_by: str, extra: str, *, package: str | None = None) -> ModuleType:
    """Import ``module``, or raise :class:`MissingExtraError`: "``needed_by`` needs ``package``:
    pip install 'fedsim-torch[extra]' (in a source checkout: pip install -e '.[extra]'; or pip install ``package``)".
    fedsim's distribution is ``fedsim-torch`` (``fedsim`` on the package index is an unrelated project).
    ``package``: the name pip knows it by (default ``module``)."""
    try:
        imported = importlib.import_module(module)
    except ImportError as error:
        broken = error.name is not None and error.name.split(".")[0] != module.split(".")[0]  # its own import failed
        text = missing_text(needed_by, package or module, extra)
        raise MissingExtraError(f"{text}; it is installed but does not import: {error}" if broken else text) from None
    for hook in list(_after_import):
        hook()
    return imported


@contextlib.contextmanager
def after_each_import(hook: Callable[[], None]) -> Iterator[None]:
    """While inside, :func:`require` calls ``hook()`` after each import, before the package does any work: the
    command line takes the console handler that some packages install when imported off the console
    (:mod:`fedsim.cli.library_output`)."""
    _after_import.append(hook)
    try:
        yield
    finally:
        _after_import.remove(hook)


def missing_text(needed_by: str, package: str, extra: str) -> str:
    """The one line :func:`require` raises for a package that is not installed."""
    return (
        f"{needed_by} needs the {package} package: pip install 'fedsim-torch[{extra}]' (in a source checkout: "
        f"pip install -e '.[{extra}]'; or pip install {package})"
    )
