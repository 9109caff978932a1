"""fedsim.data.npz_read: the arrays np.load gives, with float32 arrays tested for NaN/inf piece by piece as read."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from fedsim.data import npz_read
from fedsim.data.npz_read import read_npz


def _mixed() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "f32": rng.standard_normal((37, 5)).astype(np.float32),
        "f64": rng.standard_normal((11, 3)),
        "i64": rng.integers(0, 10, size=29),
        "flags": rng.random(13) < 0.5,
        "fortran": np.asfortranarray(rng.standard_normal((6, 4)).astype(np.float32)),
        "big_endian": rng.standard_normal(9).astype(">f4"),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "nan32": np.array([[1.0, np.nan], [2.0, 3.0]], dtype=np.float32),
    }


@pytest.mark.parametrize("chunk", [npz_read.CHUNK_BYTES, 8, 10])  # many pieces, pieces that split a row or a value
@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_the_arrays_are_np_loads_and_only_finite_native_float32_ones_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int, save
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(npz_read, "CHUNK_BYTES", chunk)
    arrays = _mixed()
    path = tmp_path / "mixed.npz"
    save(path, **arrays)
    read, finite = read_npz(path)
    with np.load(path) as expected:
        assert sorted(read) == sorted(expected.files)
        for name in expected.files:
            want = expected[name]
            got = read[name]
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert np.array_equal(got, want, equal_nan=want.dtype.kind == "f"), name
            assert got.flags.writeable, name
    # tested: float32 in this machine's byte order and C order; fortran (left to np.load) and ">f4" are not tested
    # here (tensor_data converts or checks them itself); nan32 holds a NaN
    assert finite == {"f32", "scalar", "empty"}


@pytest.mark.parametrize("where", [0, 9, 39])  # the first value, inside the second piece of 32 bytes, the last
@pytest.mark.parametrize("group", [1, 2, 8])  # pieces tested at a time: 5 pieces as 5, as 2 + 2 + 1, as 5
def test_a_non_finite_value_in_any_piece_leaves_the_array_unnamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: int, group: int
) -> None:
    monkeypatch.setattr(npz_read, "CHUNK_BYTES", 32)
    monkeypatch.setattr(npz_read, "TEST_PIECES", group)
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    x.reshape(-1)[where] = np.inf
    np.savez(tmp_path / "one.npz", x=x)
    read, finite = read_npz(tmp_path / "one.npz")
    assert "x" not in finite and np.array_equal(read["x"], x)


def test_a_member_cut_short_is_refused(tmp_path: Path) -> None:
    """A member whose header promises more values than it holds (its CRC matches what it holds)."""
    path = tmp_path / "short.npz"
    header = np.lib.format.header_data_from_array_1_0(np.zeros((100, 4), dtype=np.float32))
    with zipfile.ZipFile(path, "w") as archive, archive.open("x.npy", "w") as member:
        np.lib.format.write_array_header_1_0(member, header)
        member.write(np.zeros(7, dtype=np.float32).tobytes())
    with pytest.raises(ValueError, match=r"x\.npy ends before its 400 values"):
        read_npz(path)


def test_a_file_that_is_not_an_array_is_skipped_like_np_savez_never_writes_it(tmp_path: Path) -> None:
    path = tmp_path / "extra.npz"
    np.savez(path, x=np.ones(3, dtype=np.float32))
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("README.txt", "not an array")
    read, finite = read_npz(path)
    assert list(read) == ["x"] and finite == {"x"}
