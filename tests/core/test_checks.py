"""fedsim.core.checks: the one-line messages every package refuses its settings with, and what passes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedsim.core.checks import integer, is_integer, is_number, number, within


@pytest.mark.parametrize(
    ("value", "expected"),
    [(3, True), (np.int64(3), True), (0, True), (True, False), (3.0, False), ("3", False), (None, False)],
)
def test_is_integer_takes_ints_and_numpy_ints_but_not_bools(value: object, expected: bool) -> None:
    assert is_integer(value) is expected


@pytest.mark.parametrize(
    ("value", "finite", "expected"),
    [
        (0.5, True, True),
        (2, True, True),
        (np.float32(0.5), True, True),
        (False, True, False),
        ("0.5", True, False),
        (math.nan, True, False),
        (math.inf, True, False),
        (math.inf, False, True),
        (math.nan, False, True),
    ],
)
def test_is_number_takes_reals_but_not_bools_and_finite_ones_by_default(
    value: object, finite: bool, expected: bool
) -> None:
    assert is_number(value, finite=finite) is expected


def test_integer_returns_a_plain_int_inside_its_bounds() -> None:
    assert integer("k", 1, 1) == 1 and type(integer("k", np.int32(7), 1)) is int
    assert integer("k", 8, 2, 8) == 8 and integer("k", 2, 2, 8) == 2


@pytest.mark.parametrize(
    ("value", "highest", "message"),
    [
        (0, None, "data.num_devices must be an integer >= 1 (got 0)"),
        (2.5, None, "data.num_devices must be an integer >= 1 (got 2.5)"),
        (True, None, "data.num_devices must be an integer >= 1 (got True)"),
        ("2", None, "data.num_devices must be an integer >= 1 (got '2')"),
        (9, 8, "data.num_devices must be an integer between 1 and 8 (got 9)"),
    ],
)
def test_integer_refuses_in_one_line_naming_the_key(value: object, highest: int | None, message: str) -> None:
    with pytest.raises(ValueError) as error:
        integer("data.num_devices", value, 1, highest)
    assert str(error.value) == message


def test_number_returns_a_float_and_takes_one_bound() -> None:
    assert number("k", 2, above=0) == 2.0 and type(number("k", 2, above=0)) is float
    assert number("k", 0, at_least=0) == 0.0 and number("k", -3.5) == -3.5
    assert number("k", math.inf, above=0, allow_inf=True) == math.inf
    with pytest.raises(TypeError):
        number("k", 1, above=0, at_least=0)


@pytest.mark.parametrize(
    ("value", "bounds", "message"),
    [
        (0, {"above": 0}, "strategy.mu must be a finite number > 0 (got 0)"),
        (-0.5, {"at_least": 0}, "strategy.mu must be a finite number >= 0 (got -0.5)"),
        (math.nan, {"at_least": 0}, "strategy.mu must be a finite number >= 0 (got nan)"),
        (math.inf, {"above": 0}, "strategy.mu must be a finite number > 0 (got inf)"),
        (-math.inf, {"above": 0, "allow_inf": True}, "strategy.mu must be a finite number > 0 (or inf) (got -inf)"),
        ("fast", {}, "strategy.mu must be a finite number (got 'fast')"),
        (False, {}, "strategy.mu must be a finite number (got False)"),
        (0.5, {"above": 1.5, "hint": "; e.g. 2"}, "strategy.mu must be a finite number > 1.5 (got 0.5); e.g. 2"),
    ],
)
def test_number_refuses_in_one_line_naming_the_key(value: object, bounds: dict, message: str) -> None:
    with pytest.raises(ValueError) as error:
        number("strategy.mu", value, **bounds)
    assert str(error.value) == message


@pytest.mark.parametrize(
    ("interval", "inside", "outside"),
    [
        ("[0, 1)", [0, 0.0, 0.5, np.float64(0.999)], [1, 1.0, -0.01, math.nan, math.inf]),
        ("(0, 1]", [1, 1e-300, 0.5], [0, 0.0, 1.0000001, -math.inf]),
        ("[0, 1]", [0, 1], [-1e-9, 1 + 1e-9]),
        ("(0, 1)", [0.5], [0.0, 1.0]),
        ("[0, 0.5)", [0.0, 0.4999], [0.5, -0.1]),
    ],
)
def test_within_follows_the_brackets(interval: str, inside: list, outside: list) -> None:
    for value in inside:
        assert within("k", value, interval) == float(value)
    for value in outside:
        with pytest.raises(ValueError) as error:
            within("data.test_fraction", value, interval)
        assert str(error.value) == f"data.test_fraction must be in {interval} (got {value!r})"


def test_within_refuses_what_is_not_a_number_and_appends_the_hint() -> None:
    with pytest.raises(ValueError) as error:
        within("strategy.alpha", "half", "[0, 1]", hint=": the weight of the personal model")
    assert str(error.value) == "strategy.alpha must be in [0, 1] (got 'half'): the weight of the personal model"
    with pytest.raises(ValueError, match="not an interval"):
        within("k", 0.5, "0 to 1")
