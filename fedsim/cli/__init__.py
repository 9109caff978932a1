"""The ``fedsim`` command and the composition root: Hydra composes ``conf/``, the configuration is checked
(unknown keys, numbers, ranges) before any work, :mod:`fedsim.cli.run` builds every part from it and runs
the server, and a summary is written at the end. Only this package knows the config's keys (the trackers'
factory in :mod:`fedsim.observe.trackers` instantiates its own config node).

``fedsim.cli.main(argv)`` runs the command line in the current process (docs/python-api.md)."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """``main`` on first use: importing a submodule (a worker reading :mod:`fedsim.cli.config_numbers`) stays cheap."""
    if name == "main":
        from fedsim.cli.command import main

        return main
    raise AttributeError(f"module 'fedsim.cli' has no attribute {name!r}")
