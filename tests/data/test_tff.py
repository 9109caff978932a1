"""fedsim.data.tff: FEMNIST by writer from tiny files in TFF's HDF5 layout: the pooled layout, one client per
writer, the digits-only files, and the one-line errors (no h5py, missing, truncated, corrupt, wrong layout)."""

from __future__ import annotations

import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from hydra.utils import instantiate

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/data holds tff_files

import tff_files  # noqa: E402

from fedsim.cli.run import compose  # noqa: E402
from fedsim.client.base import Client  # noqa: E402
from fedsim.client.federation import federate, make_clients  # noqa: E402
from fedsim.data.partition import iid, natural  # noqa: E402
from fedsim.data.tensor_data import DataSplit  # noqa: E402
from fedsim.data.tff import femnist_tff  # noqa: E402
from fedsim.data.vision import DatasetNotFoundError  # noqa: E402

URL = "https://storage.googleapis.com/tff-datasets-public/fed_emnist.tar.bz2"
DIGITS_URL = "https://storage.googleapis.com/tff-datasets-public/fed_emnist_digitsonly.tar.bz2"


def _file_rows(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every writer's (pixels, label) as stored, read with h5py directly."""
    with h5py.File(path, "r") as f:
        return {cid: (g["pixels"][()], g["label"][()]) for cid, g in f["examples"].items()}


def _one_line_error(excinfo: pytest.ExceptionInfo, *parts: str) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith("data=femnist_tff")
    for part in parts:
        assert part in message, (part, message)
    return message


def test_pooled_layout_with_every_writers_rows(tmp_path: Path) -> None:
    overrides = tff_files.write_femnist_tff(tmp_path, 60, 20, writers=4)
    assert overrides == [f"data.root={tmp_path}"]
    split = femnist_tff(root=tmp_path)
    train, test = split.train, split.test
    assert train.x.shape == (80, 1, 28, 28) and train.x.dtype == torch.float32 and train.y.dtype == torch.int64
    assert train.num_classes == test.num_classes == 62 and train.groups.dtype == np.int64
    assert split.local_test.tolist() == [False] * 60 + [True] * 20
    assert test.x.data_ptr() == train.x[60:].data_ptr() and len(test) == 20  # a view of the tail: no copy
    assert np.array_equal(test.groups, train.groups[60:])
    ids = sorted(tff_files.writer_ids(4))
    for part, rows in (("train", np.arange(60)), ("test", np.arange(60, 80))):
        stored = _file_rows(tmp_path / f"fed_emnist_{part}.h5")
        for code, cid in enumerate(ids):  # groups = the writer's rank among the sorted ids
            mine = rows[train.groups[rows] == code]
            pixels, labels = stored[cid]
            assert torch.equal(train.x[mine, 0], torch.from_numpy(pixels))  # values exactly as stored
            assert train.y[mine].tolist() == labels.tolist()


def test_natural_partition_gives_one_client_per_writer_with_its_own_test_rows(tmp_path: Path) -> None:
    tff_files.write_femnist_tff(tmp_path, 60, 20, writers=4)
    split = femnist_tff(root=tmp_path)
    clients = make_clients(federate(split, natural, client_test_fraction=0.5, seed=0), Client)
    train_sizes = tff_files._uneven_sizes(60, 4)  # per writer, in creation order (reverse sorted ids)
    test_sizes = tff_files._uneven_sizes(20, 4)
    assert [c.num_train for c in clients] == train_sizes[::-1].tolist()  # client i = i-th sorted writer id
    assert [len(c.test_indices) for c in clients] == test_sizes[::-1].tolist()
    assert all(split.local_test[c.test_indices].all() and not split.local_test[c.train_indices].any() for c in clients)
    assert all(len(np.unique(split.train.groups[np.r_[c.train_indices, c.test_indices]])) == 1 for c in clients)


def test_other_partitioners_divide_the_training_rows_only(tmp_path: Path) -> None:
    tff_files.write_femnist_tff(tmp_path, 60, 20)
    split = femnist_tff(root=tmp_path)
    data = federate(
        split, lambda labels, seed, groups: iid(labels, num_clients=5, seed=seed), client_test_fraction=0.2, seed=0
    )
    rows = np.concatenate(data.client_train + data.client_test)
    assert np.array_equal(np.sort(rows), np.arange(60))


def test_digits_only_files(tmp_path: Path) -> None:
    overrides = tff_files.write_femnist_tff(tmp_path, 30, 12, only_digits=True)
    assert overrides[-1] == "data.only_digits=true"
    split = femnist_tff(root=tmp_path, only_digits=True)
    assert split.train.num_classes == 10 and len(split.train) == 42 and int(split.train.y.max()) <= 9
    with pytest.raises(DatasetNotFoundError) as info:
        femnist_tff(root=tmp_path)  # the 62-class files are not there
    _one_line_error(info, str(tmp_path / "fed_emnist_train.h5"), URL)


def test_without_h5py_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tff_files.write_femnist_tff(tmp_path, 6, 3)
    monkeypatch.setitem(sys.modules, "h5py", None)  # what `import h5py` meets when it is not installed
    with pytest.raises(ImportError) as info:
        femnist_tff(root=tmp_path)
    _one_line_error(info, "pip install 'fedsim-torch[tff]'", "pip install h5py")


@pytest.mark.parametrize(
    ("only_digits", "missing", "present", "url"),
    [
        (False, "fed_emnist_test.h5", "fed_emnist_train.h5", URL),
        (True, "fed_emnist_digitsonly_train.h5", "fed_emnist_digitsonly_test.h5", DIGITS_URL),
    ],
)
def test_missing_file_names_it_and_the_source(
    tmp_path: Path, only_digits: bool, missing: str, present: str, url: str
) -> None:
    tff_files.write_femnist_tff(tmp_path, 6, 3, only_digits=only_digits)
    (tmp_path / missing).unlink()
    with pytest.raises(DatasetNotFoundError) as info:
        femnist_tff(root=tmp_path, only_digits=only_digits)
    message = _one_line_error(info, str(tmp_path / missing), url)
    assert isinstance(info.value, FileNotFoundError) and present not in message


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_unreadable_file_names_it(tmp_path: Path, damage: str) -> None:
    tff_files.write_femnist_tff(tmp_path, 30, 9)
    path = tmp_path / "fed_emnist_train.h5"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"not an HDF5 file\n" * 50)
    with pytest.raises(DatasetNotFoundError) as info:
        femnist_tff(root=tmp_path)
    message = _one_line_error(info, f"cannot read {path} as HDF5", URL)
    assert "fed_emnist_test.h5" not in message


def _rewrite(path: Path, edit: str) -> None:
    with h5py.File(path, "a") as f:
        writer = f["examples"][sorted(f["examples"])[0]]
        if edit == "no_pixels":
            del writer["pixels"]
        elif edit == "bad_shape":
            n = writer["label"].shape[0]
            del writer["pixels"]
            writer["pixels"] = np.zeros((n, 28, 27), dtype=np.float32)
        elif edit == "bad_label":
            labels = writer["label"][()]
            labels[0] = 62
            writer["label"][...] = labels
        else:
            f.move("examples", "clients")


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ("no_layout", "has no 'examples' group"),
        ("no_pixels", "writer 'f0000_00' has no 'pixels' dataset"),
        ("bad_shape", "writer 'f0000_00' has pixels (6, 28, 27)"),
        ("bad_label", "writer 'f0000_00' has label 62; labels must be 0..61"),
    ],
)
def test_wrong_layout_is_a_one_line_value_error(tmp_path: Path, edit: str, expected: str) -> None:
    tff_files.write_femnist_tff(tmp_path, 30, 12)
    path = tmp_path / "fed_emnist_test.h5"
    _rewrite(path, edit)
    with pytest.raises(ValueError) as info:
        femnist_tff(root=tmp_path)
    _one_line_error(info, str(path), expected)


@pytest.mark.parametrize("dataset", ["pixels", "label"])
def test_a_non_finite_pixel_or_label_is_refused_naming_file_writer_and_row(tmp_path: Path, dataset: str) -> None:
    tff_files.write_femnist_tff(tmp_path, 30, 30)
    path = tmp_path / "fed_emnist_test.h5"
    with h5py.File(path, "a") as f:
        cid = sorted(f["examples"])[1]
        writer = f["examples"][cid]
        values = writer[dataset][()].astype(np.float32)
        row = len(values) - 1 if dataset == "pixels" else 3  # pixels: the writer's last row, next to the next writer's
        if dataset == "pixels":
            values[row, 10, 12] = np.nan
            writer["pixels"][...] = values
        else:  # a float label dataset: read into int64 as it is, its inf would become an arbitrary number
            values[row] = np.inf
            del writer["label"]
            writer["label"] = values
    with pytest.raises(ValueError) as info:
        femnist_tff(root=tmp_path)
    shown = "nan" if dataset == "pixels" else "inf"
    assert str(info.value) == (
        f"data: {path}: {dataset} has a non-finite value ({shown}) at row {row} (client {cid!r}); fix or drop that row"
    )


def test_conf_option_loads_the_files(tmp_path: Path) -> None:
    overrides = tff_files.write_femnist_tff(tmp_path, 60, 20)
    split = instantiate(compose(["data=femnist_tff", *overrides]).data)
    assert (
        isinstance(split, DataSplit) and len(split.train) - int(split.local_test.sum()) == 60 and len(split.test) == 20
    )
    assert split.train.input_shape == (1, 28, 28) and split.train.num_classes == 62
