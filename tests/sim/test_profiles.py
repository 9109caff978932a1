"""Device profiles for the simulated clock: sampled ones (determinism, distributions), availability windows,
and the CSV trace reader with its one-line errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fedsim.sim.profiles import DeviceProfiles, sampled_profiles, trace_profiles
from fedsim.sim.trace import HEADER

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "experiments" / "sim" / "example_trace.csv"
H = 3600.0
DAY = 24 * H
FIELDS = ("speed", "upload", "download", "online_start", "online_length")


def _same(a: DeviceProfiles, b: DeviceProfiles, n: int | None = None) -> bool:
    return a.period_s == b.period_s and all(np.array_equal(getattr(a, f)[:n], getattr(b, f)[:n]) for f in FIELDS)


# --------------------------------------------------------------------------------------------------
# sampled profiles: determinism


def test_sampled_profiles_are_a_function_of_the_seed() -> None:
    assert _same(sampled_profiles(30, 7), sampled_profiles(30, 7))
    other = sampled_profiles(30, 8)
    assert not any(np.array_equal(getattr(other, f), getattr(sampled_profiles(30, 7), f)) for f in FIELDS)


@pytest.mark.parametrize("kwargs", [{}, {"speed_sigma": 0.3, "online_fraction_mean": 0.6, "period_s": 3600.0}])
def test_drawing_more_clients_keeps_the_first_ones(kwargs: dict) -> None:
    few, many = sampled_profiles(12, 3, **kwargs), sampled_profiles(50, 3, **kwargs)
    assert few.num_clients == 12 and many.num_clients == 50
    assert _same(few, many, 12)


def test_always_online_changes_no_speed_or_bandwidth() -> None:
    daily = sampled_profiles(25, 4)
    for always in (sampled_profiles(25, 4, always_online=True), sampled_profiles(25, 4, period_s=math.inf)):
        assert always.always_online and math.isinf(always.period_s)
        for f in ("speed", "upload", "download"):
            assert np.array_equal(getattr(always, f), getattr(daily, f))
        for t in (0.0, 5.5 * H, 3 * DAY + 1.0):
            assert always.online(t).all() and always.online_at(3, t) and always.next_online(t) == t
    assert not daily.always_online


def test_online_fraction_one_is_always_online() -> None:
    profiles = sampled_profiles(10, 0, online_fraction_mean=1.0)
    assert profiles.always_online and profiles.online(123.0).all()


# --------------------------------------------------------------------------------------------------
# sampled profiles: distributions, on 20 000 clients
#
# Bounds are loose multiples of the standard errors (SE) at n = 20 000: the sample median of log X has SE
# 1.2533·σ/√n ≤ 0.011 for σ ≤ 1.2, so 0.05 is > 4.5 SE; the sample std of log X has SE σ/√(2n) ≤ 0.006, so 0.03
# is > 5 SE; a correlation of independent draws has SE 1/√n ≈ 0.007, so 0.04 is > 5 SE; a share of n Bernoulli
# draws has SE ≤ 0.0035, so 0.02 is > 5 SE; the mean of the online fractions (Beta, std ≈ 0.15) has SE ≈ 0.001,
# so 0.01 is > 9 SE. The seed is fixed, so the test is deterministic; the margins say any seed would pass.

CONFIG = {
    "speed_median": 50.0,
    "speed_sigma": 0.5,
    "upload_median": 3e5,
    "upload_sigma": 1.2,
    "download_median": 4e6,
    "download_sigma": 0.8,
    "period_s": DAY,
    "online_fraction_mean": 0.4,
}


@pytest.fixture(scope="module")
def many() -> DeviceProfiles:
    return sampled_profiles(20_000, 11, **CONFIG)


@pytest.mark.parametrize("field", ["speed", "upload", "download"])
def test_speeds_and_bandwidths_are_lognormal_as_configured(many: DeviceProfiles, field: str) -> None:
    logs = np.log(getattr(many, field))
    assert abs(np.median(logs) - math.log(CONFIG[f"{field}_median"])) < 0.05
    assert abs(logs.std() - CONFIG[f"{field}_sigma"]) < 0.03
    skew = np.mean(((logs - logs.mean()) / logs.std()) ** 3)  # a normal's skewness is 0 (SE √(6/n) ≈ 0.017)
    assert abs(skew) < 0.1


def test_speeds_and_bandwidths_are_independent(many: DeviceProfiles) -> None:
    corr = np.corrcoef(np.log(np.stack([many.speed, many.upload, many.download])))
    assert np.all(np.abs(corr[np.triu_indices(3, 1)]) < 0.04)


def test_online_windows_are_distributed_as_configured(many: DeviceProfiles) -> None:
    assert abs(np.mean(many.online_length / DAY) - CONFIG["online_fraction_mean"]) < 0.01
    assert np.all((many.online_length > 0) & (many.online_length <= DAY))
    assert np.all((many.online_start >= 0) & (many.online_start < DAY))
    quarters = np.bincount((many.online_start // (DAY / 4)).astype(int), minlength=4) / many.num_clients
    assert np.all(np.abs(quarters - 0.25) < 0.02)  # starts uniform over the day
    for t in (0.0, 7.3 * H, 2 * DAY + 17 * H):  # at any time, about the mean share of clients is online
        assert abs(many.online(t).mean() - CONFIG["online_fraction_mean"]) < 0.02


# --------------------------------------------------------------------------------------------------
# availability windows on hand-made profiles


def _windows(starts_h: list[float], hours: list[float], period_s: float = DAY) -> DeviceProfiles:
    n = len(starts_h)
    return DeviceProfiles(
        np.full(n, 10.0), np.full(n, 1e5), np.full(n, 1e6), period_s, np.array(starts_h) * H, np.array(hours) * H
    )


def test_online_inside_the_window_only_and_every_period() -> None:
    p = _windows([8.0, 22.0, 5.0], [2.0, 4.0, 24.0])  # 08-10; 22-02 across midnight; always
    cases = {  # hour of the day -> who is online
        7.99: [False, False, True],
        8.0: [True, False, True],
        9.99: [True, False, True],
        10.0: [False, False, True],
        21.99: [False, False, True],
        22.0: [False, True, True],
        23.5: [False, True, True],
        0.0: [False, True, True],
        1.99: [False, True, True],
        2.0: [False, False, True],
    }
    for day in (0, 1, 9):
        for hour, expected in cases.items():
            t = day * DAY + hour * H
            assert p.online(t).tolist() == expected, (day, hour)
            assert [p.online_at(c, t) for c in range(3)] == expected
    assert not p.always_online and _windows([3.0], [24.0]).always_online


def test_a_full_length_window_is_online_just_before_its_start() -> None:
    p = _windows([1e-14 / H], [24.0])  # t - start is a hair below 0: its phase rounds to the period itself
    assert p.online(0.0).all() and p.online_at(0, 0.0)


def test_next_online_is_the_next_window_start() -> None:
    p = _windows([8.0, 22.0], [2.0, 4.0])
    assert p.next_online(3 * H) == 8 * H
    assert p.next_online(11 * H) == 22 * H
    assert p.next_online(23 * H) == 23 * H  # someone is online already
    assert p.next_online(5 * DAY + 2 * H) == 5 * DAY + 8 * H


def test_next_online_never_skips_a_window_and_always_lands_online() -> None:
    rng = np.random.default_rng(0)
    p = DeviceProfiles(np.ones(5), np.ones(5), np.ones(5), 1000.0, rng.uniform(0, 1000, 5), rng.uniform(1, 30, 5))
    for t in np.concatenate([rng.uniform(0, 5000, 200), rng.uniform(1e7, 1e9, 200)]):
        nxt = p.next_online(float(t))
        assert nxt >= t and p.online(nxt).any()
        if nxt > t:  # nobody was online in between
            assert not any(p.online(u).any() for u in np.linspace(t, nxt, 40, endpoint=False))


# --------------------------------------------------------------------------------------------------
# DeviceProfiles and sampled_profiles refuse bad values in one line


def _one_line(excinfo: pytest.ExceptionInfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"speed": [1.0, 0.0]}, "speed must be finite and > 0 for every client (client 1"),
        ({"upload": [1.0, math.nan]}, "upload must be finite and > 0"),
        ({"download": [1.0]}, "download has 1 values but speed has 2"),
        ({"period_s": 0.0}, "period_s must be > 0"),
        ({"online_start": [0.0, 100.0]}, "online_start must be in [0, period_s=100)"),
        ({"online_length": [0.0, 5.0]}, "online_length must be in (0, period_s=100]"),
        ({"speed": [[1.0, 2.0]]}, "speed must be a non-empty 1-D array"),
    ],
)
def test_device_profiles_refuse_bad_values(change: dict, words: str) -> None:
    fields = {
        "speed": [1.0, 2.0],
        "upload": [1.0, 2.0],
        "download": [1.0, 2.0],
        "period_s": 100.0,
        "online_start": [0.0, 50.0],
        "online_length": [10.0, 100.0],
        **change,
    }
    with pytest.raises(ValueError) as excinfo:
        DeviceProfiles(**fields)
    assert words in _one_line(excinfo)


def test_device_profiles_are_read_only_copies() -> None:
    speed = np.array([1.0, 2.0])
    p = DeviceProfiles(speed, speed, speed, 10.0, np.zeros(2), np.ones(2))
    speed[0] = 5.0
    assert p.speed[0] == 1.0
    with pytest.raises(ValueError):
        p.speed[0] = 3.0


@pytest.mark.parametrize(
    ("args", "kwargs", "words"),
    [
        ((0, 1), {}, "num_clients must be an integer >= 1"),
        ((5, -1), {}, "seed must be an integer >= 0"),
        ((5, 1), {"speed_median": 0.0}, "speed_median must be a finite number > 0"),
        ((5, 1), {"upload_sigma": -0.1}, "upload_sigma must be a finite number >= 0"),
        ((5, 1), {"period_s": -5.0}, "period_s must be a finite number > 0 (or inf)"),
        ((5, 1), {"online_fraction_mean": 0.0}, "online_fraction_mean must be in (0, 1] (got 0.0)"),
        ((5, 1), {"online_fraction_mean": 1.5}, "online_fraction_mean must be in (0, 1]"),
    ],
)
def test_sampled_profiles_refuse_bad_parameters(args: tuple, kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        sampled_profiles(*args, **kwargs)
    assert words in _one_line(excinfo)


# --------------------------------------------------------------------------------------------------
# traces


def test_the_example_trace_reads_in_profile_units() -> None:
    p = trace_profiles(EXAMPLE, 20)
    assert p.num_clients == 20 and p.period_s == DAY and not p.always_online
    assert (p.speed[0], p.upload[0], p.download[0]) == (120.0, 2.5 * 125_000, 25 * 125_000)
    assert (p.online_start[0], p.online_length[0]) == (22 * H, 8 * H)
    always = [c for c in range(20) if all(p.online_at(c, h * H) for h in range(24))]
    assert always == [2, 8, 19]  # the rows with online_hours 24
    assert p.online_at(0, 23 * H) and p.online_at(0, 5 * H) and not p.online_at(0, 12 * H)
    assert _same(trace_profiles(str(EXAMPLE), 10), p, 10)  # rows beyond the run's clients are ignored


def _write(tmp_path: Path, text: str, name: str = "trace.csv", encoding: str = "utf-8") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding=encoding)
    return path


def test_a_trace_may_reorder_columns_and_rows_quote_values_and_carry_comments(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        (
            "# measured on the lab's phones\n\n"
            "online_hours, client_id ,examples_per_s,upload_mbps,download_mbps,online_start_h\n"
            '24,1,"40", 0.8 ,8,0\n'
            "  # a comment between rows\n"
            "2.5,0,250.5,1e1,100,23\n"
            "6,2,10,1,1,0\n"  # a third client, beyond this run's two: checked, then ignored
        ),
        encoding="utf-8-sig",
    )  # a byte-order mark, as spreadsheet exports write
    p = trace_profiles(path, 2)
    assert p.speed.tolist() == [250.5, 40.0]
    assert p.upload.tolist() == [1.25e6, 1e5] and p.download.tolist() == [1.25e7, 1e6]
    assert p.online_start.tolist() == [23 * H, 0.0] and p.online_length.tolist() == [2.5 * H, DAY]
    assert p.online_at(0, 23.5 * H) and p.online_at(0, 1.49 * H) and not p.online_at(0, 1.5 * H)  # 23:00-01:30


GOOD = "0,100,2,20,22,8\n"
ERRORS = [  # (file text, line, field, words in the message)
    ("", 1, None, "the file is empty"),
    ("# nothing but a comment\n\n", 1, None, "the file is empty"),
    (f"{HEADER}\n", 1, None, "no client rows"),
    (HEADER.replace(",online_hours", "") + "\n0,1,1,1,0\n", 1, "'online_hours'", "is missing"),
    (HEADER + ",battery\n" + GOOD, 1, "'battery'", "unknown column"),
    (HEADER + ",upload_mbps\n" + GOOD, 1, "'upload_mbps'", "appears twice"),
    (GOOD + GOOD, 1, "'0'", "unknown column"),  # no header
    (f"{HEADER}\n0,100,fast,20,22,8\n", 2, "field upload_mbps", "'fast' is not a number"),
    (f"{HEADER}\n0,100,2,nan,22,8\n", 2, "field download_mbps", "not a finite number"),
    (f"{HEADER}\n0,100,2,20,22,inf\n", 2, "field online_hours", "not a finite number"),
    (f"{HEADER}\n{GOOD}1,0,2,20,22,8\n", 3, "field examples_per_s", "it must be > 0"),
    (f"{HEADER}\n0,100,-2,20,22,8\n", 2, "field upload_mbps", "it must be > 0"),
    (f"{HEADER}\n0,100,2,0,22,8\n", 2, "field download_mbps", "it must be > 0"),
    (f"{HEADER}\n0,100,2,20,24,8\n", 2, "field online_start_h", "must be in [0, 24)"),
    (f"{HEADER}\n0,100,2,20,-1,8\n", 2, "field online_start_h", "must be in [0, 24)"),
    (f"{HEADER}\n0,100,2,20,22,0\n", 2, "field online_hours", "must be in (0, 24]"),
    (f"{HEADER}\n0,100,2,20,22,25\n", 2, "field online_hours", "must be in (0, 24]"),
    (f"{HEADER}\nfirst,100,2,20,22,8\n", 2, "field client_id", "'first' is not a client id"),
    (f"{HEADER}\n-1,100,2,20,22,8\n", 2, "field client_id", "'-1' is not a client id"),
    (f"{HEADER}\n1.5,100,2,20,22,8\n", 2, "field client_id", "'1.5' is not a client id"),
    (f"{HEADER}\n0,100,2,20\n", 2, "field online_start_h", "missing (the row has 4 values, the header 6)"),
    (f"{HEADER}\n0,100,2,20,22,8,9\n", 2, "field online_hours", "7 values but the header has 6 columns"),
    (f"{HEADER}\n{GOOD}# a comment\n0,50,1,10,0,24\n", 4, "field client_id", "client 0 already has a row on line 2"),
]


@pytest.mark.parametrize(("text", "line", "field", "words"), ERRORS)
def test_every_trace_mistake_is_one_line_naming_file_line_and_field(
    tmp_path: Path, text: str, line: int, field: str | None, words: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ValueError) as excinfo:
        trace_profiles(path, 1)
    msg = _one_line(excinfo)
    assert f"device trace {path} line {line}" in msg and words in msg
    assert field is None or field in msg


def test_missing_clients_are_named_first_few(tmp_path: Path) -> None:
    path = _write(tmp_path, f"{HEADER}\n{GOOD}1,50,1,10,0,24\n9,50,1,10,0,24\n")
    with pytest.raises(ValueError) as excinfo:
        trace_profiles(path, 9)
    msg = _one_line(excinfo)
    assert f"device trace {path} field client_id: no row for client(s) 2, 3, 4, 5, 6 and 2 more" in msg
    assert "(the run has 9 clients, 0..8); add one row for each" in msg
    assert trace_profiles(path, 2).num_clients == 2  # the same file serves a run of 2 clients


def test_a_missing_trace_file_says_what_to_give(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.csv"
    with pytest.raises(FileNotFoundError) as excinfo:
        trace_profiles(path, 3)
    msg = _one_line(excinfo)
    assert str(path) in msg and HEADER in msg and "example_trace.csv" in msg


def test_a_binary_trace_file_is_one_line_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_bytes(HEADER.encode() + b"\n0,100,2,20,22,8\n\xb4\x00\xff\n")
    with pytest.raises(ValueError) as excinfo:
        trace_profiles(path, 1)
    msg = _one_line(excinfo)
    assert msg.startswith(f"device trace {path} line 3: byte 0xb4 is not UTF-8 text")


def test_trace_profiles_refuses_a_bad_client_count() -> None:
    with pytest.raises(ValueError) as excinfo:
        trace_profiles(EXAMPLE, 0)
    assert "num_clients must be an integer >= 1" in _one_line(excinfo)


def test_window_after_is_the_next_opening_even_far_from_the_period_scale() -> None:
    """Near t = 0 a day-long period's rounding (1.5e-11 s) is hundreds of steps of t's own (2.8e-14 s at 175 s):
    the opening is computed as start + k·period, so it lands on the window, not short of it. (next_online's own
    estimate here is 164 steps short; it used to give up after 64 and raise.)"""
    p = _windows([175.62 / H], [0.5])  # a window opening 175.62 s into the day
    for t in (0.0, 100.0, 175.62 - 1e-9, 175.62 + 1.0, DAY - 1.0):
        when = p.window_after(0, t)
        assert when > t and p.online_at(0, when)
        assert abs(when - (175.62 if t < 175.62 else DAY + 175.62)) < 1e-9
    assert p.next_online(100.0) == p.window_after(0, 100.0)
