"""Read an ``.npz`` file and test its float32 arrays for NaN and infinity while they are read, not after.

``np.load`` reads a member in pieces and copies them into the array; a separate finite test afterwards reads the
whole array again (at memory speed: 6 % of a page-cache load of 1,000,000 rows of 60 float32 features). Here each
piece of ``CHUNK_BYTES`` is read into the array, and every ``TEST_PIECES`` pieces are handed to a second thread that
tests them while the next ones are read (docs/performance.md, "The finite check of the data"). The arrays are the
ones ``np.load`` gives (same dtype, shape and values; a member whose CRC does not match is refused as zipfile refuses
it); a member that is not a plain C-order numeric array is read by ``np.load``'s own reader, and only float32 arrays
are tested here (other floats are converted first, and tested after conversion by
:func:`~fedsim.data.tensor_data.split_from_arrays`).
"""

from __future__ import annotations

import queue
import threading
import zipfile
from pathlib import Path
from typing import cast

import numpy as np

CHUNK_BYTES = 1 << 20
"""Bytes read and tested at a time. 1 MiB: the piece is still in the cache when tested; a larger piece is slower to
read (zipfile returns each piece as a new bytes object: 4 MiB pieces made a 1M x 60 load 30 % slower than
``np.load``, 1-2 MiB as fast, measured on the 2-core CI machine)."""


TEST_PIECES = 8
"""Pieces handed to the testing thread at a time: one wake-up per 8 MiB instead of per MiB (the span was just read,
so it is still in the L3 cache)."""


def read_npz(path: str | Path) -> tuple[dict[str, np.ndarray], frozenset[str]]:
    """Every array in the file by name, and the names of the float32 arrays found to hold only finite values (one
    that holds a NaN or infinity is not named; the caller's own check then finds the row)."""
    arrays: dict[str, np.ndarray] = {}
    finite: set[str] = set()
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):  # not an array (np.savez writes only .npy members)
                continue
            name = info.filename.removesuffix(".npy")
            with archive.open(info) as member:
                array, all_finite = _read_member(cast(zipfile.ZipExtFile, member))
            if array is None:
                with archive.open(info) as member:
                    array = np.lib.format.read_array(member, allow_pickle=False)
            arrays[name] = array
            if all_finite:
                finite.add(name)
    return arrays, frozenset(finite)


def _read_member(member: zipfile.ZipExtFile) -> tuple[np.ndarray | None, bool]:
    """The member's array and whether it is float32 with only finite values; ``(None, False)`` for a layout left
    to ``np.load`` (Fortran order, structured or object dtypes, unknown header versions)."""
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(member)
    elif version == (2, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(member)
    else:
        return None, False
    if fortran_order or dtype.hasobject or dtype.fields is not None or dtype.kind not in "biuf":
        return None, False
    array = np.empty(shape, dtype=dtype)
    flat = array.reshape(-1).view(np.uint8)
    tester = _Tester() if dtype == np.float32 and dtype.isnative else None
    step = max(CHUNK_BYTES // dtype.itemsize, 1) * dtype.itemsize  # whole values per piece
    tested = 0  # bytes handed to the tester so far: it gets TEST_PIECES pieces at a time (fewer thread wake-ups)
    try:
        for start in range(0, flat.size, step):
            piece = flat[start : start + step]
            if member.readinto(piece.data) != piece.size:
                raise ValueError(f"{member.name} ends before its {array.size} values")
            end = start + piece.size
            if tester is not None and (end - tested >= TEST_PIECES * step or end == flat.size):
                tester.test(flat[tested:end].view(np.float32))
                tested = end
    finally:
        all_finite = tester is not None and tester.result()
    return array, all_finite


class _Tester:
    """Tests pieces for NaN and infinity on a thread of its own while the next pieces are read (numpy's sum releases
    the GIL; measured on 2 cores, a 1,000,000 x 60 load took 9 % longer with the test on the reading thread and
    5 % with it here). A sum that overflows although every value is finite reads as not finite; the caller's own
    check then looks at the rows."""

    def __init__(self) -> None:
        self._pieces: queue.SimpleQueue[np.ndarray | None] = queue.SimpleQueue()
        self._finite = True
        self._thread = threading.Thread(target=self._run, name="fedsim-npz-finite", daemon=True)
        self._thread.start()

    def test(self, piece: np.ndarray) -> None:
        self._pieces.put(piece)

    def result(self) -> bool:
        """Whether every piece was finite (waits for the last one)."""
        self._pieces.put(None)
        self._thread.join()
        return self._finite

    def _run(self) -> None:
        while (piece := self._pieces.get()) is not None:
            if self._finite and not np.isfinite(piece.sum()):
                self._finite = False
