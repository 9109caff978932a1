"""The hint for a key Hydra refuses: a typo for fedsim's own classes, `+key=...` for a user's class that reads it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra.errors import HydraException

from fedsim.cli.override_errors import override_error_line
from fedsim.cli.run import compose

USER_PKG = str(Path(__file__).parents[1] / "user_pkg")  # my_strategy.KeepGlobal(marker), a strategy outside fedsim


@pytest.fixture
def user_pkg_importable() -> Iterator[None]:
    sys.path.insert(0, USER_PKG)
    yield
    sys.path.remove(USER_PKG)


def _line(overrides: list[str]) -> str:
    with pytest.raises(HydraException) as raised:
        compose(overrides)
    line = override_error_line(raised.value, overrides)
    assert line is not None and "\n" not in line
    return line


def test_a_key_fedsims_own_strategy_does_not_read_is_called_a_typo() -> None:
    assert _line(["strategy=fedprox", "strategy.alpha=0.5"]) == (
        "unknown setting strategy.alpha (a typo? `+strategy.alpha=...` would add a key that fedsim does not read)"
    )


@pytest.mark.usefixtures("user_pkg_importable")
def test_a_key_the_users_own_strategy_reads_is_to_be_added_with_a_plus() -> None:
    line = _line(["strategy._target_=my_strategy.KeepGlobal", "strategy.marker=run.log"])
    assert line == (
        "unknown setting strategy.marker (strategy._target_ is your my_strategy.KeepGlobal, which takes it: "
        "add it with `+strategy.marker=...`)"
    )
    # and the advice is right: with the +, the key composes and reaches the class
    assert (
        compose(["strategy._target_=my_strategy.KeepGlobal", "+strategy.marker=run.log"]).strategy.marker == "run.log"
    )


@pytest.mark.usefixtures("user_pkg_importable")
def test_a_key_the_users_own_strategy_does_not_take_names_what_it_takes() -> None:
    assert _line(["strategy._target_=my_strategy.KeepGlobal", "strategy.markr=run.log"]) == (
        "unknown setting strategy.markr; did you mean strategy.marker? (my_strategy.KeepGlobal takes marker; "
        "`+strategy.markr=...` would add a key it does not read)"
    )
