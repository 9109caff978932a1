"""The Python API of a configured run (docs/python-api.md), kept at this path for researchers' scripts: the
implementation lives in :mod:`fedsim.cli.run`."""

from fedsim.cli.config import ConfigError
from fedsim.cli.run import (
    build_attack,
    build_clock,
    build_compression,
    build_data,
    build_model_factory,
    build_privacy,
    build_server,
    compose,
    run_config,
)


def main() -> None:
    """The ``fedsim`` command line (:func:`fedsim.cli.main`), as this module's ``main`` always was."""
    from fedsim.cli.command import main as cli_main

    cli_main()


__all__ = [
    "ConfigError",
    "main",
    "build_attack",
    "build_clock",
    "build_compression",
    "build_data",
    "build_model_factory",
    "build_privacy",
    "build_server",
    "compose",
    "run_config",
]
