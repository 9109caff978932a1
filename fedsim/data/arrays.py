"""Bring your own data: arrays in memory or in one ``.npz`` file, as a :class:`~fedsim.data.tensor_data.DataSplit`.

From Python::

    split = DataSplit.from_arrays(x_train, y_train, x_test, y_test, client_ids=writer_of_each_row)

From the command line (``conf/data/npz.yaml``)::

    python -m fedsim data=npz data.path=/data/mine.npz partition=natural model=mlp

The ``.npz`` file holds ``x_train``, ``y_train``, ``x_test``, ``y_test`` and optionally ``client_ids`` (the
owner of every training row, for ``partition=natural``) and ``test_client_ids`` (the owner of every test row:
then each client also tests on its own rows, as with LEAF). Features become float32 (int64 for integer
arrays, which text models read as token ids); labels become int64 class indices. Float32 numpy features are
used without a copy, so memory stays at the arrays' own size. A NaN or infinite feature or label is refused in one
line naming the file, the array, its first such row and that row's owner (:mod:`fedsim.data.finite`).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from fedsim.data.finite import NonFiniteDataError
from fedsim.data.npz_read import read_npz
from fedsim.data.tensor_data import DataSplit, split_from_arrays, split_from_pool

NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
"""The arrays an ``.npz`` file must hold."""
__all__ = ["NPZ_KEYS", "npz", "split_from_arrays", "split_from_pool"]  # the two builders: fedsim.data.tensor_data


def npz(*, path: str | Path, num_classes: int | None = None) -> DataSplit:
    """Read one ``.npz`` file (see the module docstring); a missing file or array is refused in one line."""
    where = os.path.expanduser(str(path))
    if not os.path.isfile(where):
        raise FileNotFoundError(
            f"data=npz: no file {where}; set data.path to an .npz written with "
            f"np.savez(path, {', '.join(k + '=...' for k in NPZ_KEYS)})"
        )
    try:
        arrays, finite = read_npz(where)  # float32 arrays tested for NaN/inf while read (fedsim.data.npz_read)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise ValueError(f"data=npz: cannot read {where} as an .npz file ({type(err).__name__}: {err})") from None
    missing = [key for key in NPZ_KEYS if key not in arrays]
    if missing:
        raise ValueError(
            f"data=npz: {where} has no {', '.join(missing)} (it holds {', '.join(sorted(arrays)) or 'nothing'}); "
            f"save all of {', '.join(NPZ_KEYS)}"
        )
    try:
        return split_from_arrays(
            *(arrays[key] for key in NPZ_KEYS),
            num_classes=num_classes,
            client_ids=arrays.get("client_ids"),
            test_client_ids=arrays.get("test_client_ids"),
            source=where,
            finite=finite,
        )
    except NonFiniteDataError:
        raise  # names the file already
    except ValueError as err:
        raise ValueError(f"{err} (in {where})") from None
