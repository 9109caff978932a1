"""fedsim.data.reading: what the dataset readers share (memory available, the refusal of what cannot fit)."""

from __future__ import annotations

import os

import pytest

from fedsim.core.errors import ConfigError
from fedsim.data.reading import available_memory, byte_size, one_line, refuse_beyond_memory


def test_one_line_joins_lines_and_cuts_long_text() -> None:
    assert one_line("first\n  second  \n\nthird") == "first second third"
    assert one_line("x" * 400, limit=10) == "xxxxxxx..."


@pytest.mark.parametrize(
    ("count", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (3 * 2**30 // 2, "1.5 GiB"), (2.5 * 2**40, "2.5 TiB")],
)
def test_byte_size_uses_the_largest_binary_unit(count: float, text: str) -> None:
    assert byte_size(count) == text


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="reads Linux's /proc/meminfo")
def test_available_memory_is_linuxs_memavailable() -> None:
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in meminfo}
    available = available_memory()
    assert available is not None and 0 < available <= fields["MemTotal"]


def test_what_does_not_fit_is_refused_in_one_line_naming_the_setting() -> None:
    refuse_beyond_memory("data.num_devices=10", 2**30, "10 devices", "lower it", available=2**30)  # fits exactly
    with pytest.raises(ConfigError) as error:
        refuse_beyond_memory("data.num_devices=10", 2**30 + 1, "10 devices", "lower it", available=2**30)
    assert str(error.value) == (
        "data.num_devices=10: 10 devices need about 1.0 GiB of memory (estimated from the settings), more than the "
        "1.0 GiB available; lower it"
    )
