"""fedsim.data.cifar100: CIFAR-100 from tiny files in the real pickle format, its fine→coarse map, errors, conf."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import torch
from hydra.utils import instantiate

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/data holds tff_files

import tff_files  # noqa: E402

from fedsim.cli.run import compose  # noqa: E402
from fedsim.data.cifar100 import CIFAR100_COARSE_OF, CIFAR100_MEAN, CIFAR100_STD, cifar100  # noqa: E402
from fedsim.data.pachinko import pachinko  # noqa: E402
from fedsim.data.tensor_data import DataSplit  # noqa: E402
from fedsim.data.vision import DatasetNotFoundError  # noqa: E402


def _pickle(root: Path, name: str) -> dict:
    with open(root / "cifar-100-python" / name, "rb") as f:
        return pickle.load(f)


def _pixels(x: torch.Tensor) -> torch.Tensor:
    """Normalised images back on the 0..255 scale."""
    view = (1, 3, 1, 1)
    return (x * torch.tensor(CIFAR100_STD).view(view) + torch.tensor(CIFAR100_MEAN).view(view)) * 255


def test_loads_fine_labels_and_normalised_images(tmp_path: Path) -> None:
    overrides = tff_files.write_cifar100(tmp_path, n_train=130, n_test=40)
    assert overrides == [f"data.root={tmp_path}", "data.verify_checksums=false"]
    split = cifar100(root=tmp_path, verify_checksums=False)
    for part, n, name in ((split.train, 130, "train"), (split.test, 40, "test")):
        raw = _pickle(tmp_path, name)
        assert part.x.shape == (n, 3, 32, 32) and part.x.dtype == torch.float32 and part.x.is_contiguous()
        assert part.y.dtype == torch.int64 and part.y.tolist() == raw["fine_labels"]
        assert part.num_classes == 100 and part.groups is None
        expected = torch.from_numpy(raw["data"]).reshape(n, 3, 32, 32).float()  # (N, 3072) in channel planes
        torch.testing.assert_close(_pixels(part.x), expected, atol=1e-3, rtol=0)
    assert sorted(set(split.train.y.tolist())) == list(range(100))


def test_coarse_map_matches_the_files(tmp_path: Path) -> None:
    # the files' coarse labels come from the published superclass table by name (tff_files), not from fedsim
    tff_files.write_cifar100(tmp_path, n_train=200, n_test=100)
    split = cifar100(root=tmp_path, verify_checksums=False)
    for part, name in ((split.train, "train"), (split.test, "test")):
        coarse = np.array(_pickle(tmp_path, name)["coarse_labels"])
        np.testing.assert_array_equal(CIFAR100_COARSE_OF[part.y.numpy()], coarse)
    assert np.array_equal(CIFAR100_COARSE_OF, tff_files.coarse_label_of_fine())  # all 100 entries
    assert np.bincount(CIFAR100_COARSE_OF).tolist() == [5] * 20
    meta = _pickle(tmp_path, "meta")
    assert (
        meta["fine_label_names"][0] == "apple"
        and meta["coarse_label_names"][CIFAR100_COARSE_OF[0]] == "fruit_and_vegetables"
    )


def test_pachinko_partition_of_the_loaded_labels(tmp_path: Path) -> None:
    tff_files.write_cifar100(tmp_path, n_train=400, n_test=20)
    labels = cifar100(root=tmp_path, verify_checksums=False).train.labels
    parts = pachinko(labels, num_clients=4, seed=0)
    assert [len(p) for p in parts] == [100] * 4
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(400))


def test_checksum_mismatch_is_one_line(tmp_path: Path) -> None:
    tff_files.write_cifar100(tmp_path, n_train=10, n_test=10)
    with pytest.raises(DatasetNotFoundError) as info:
        cifar100(root=tmp_path)
    message = str(info.value)
    assert "\n" not in message and message.startswith("data=cifar100: ")
    assert "md5" in message and "data.verify_checksums=false" in message
    assert str(tmp_path / "cifar-100-python") in message


def test_absent_files_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        cifar100(root=tmp_path)
    message = str(info.value)
    assert "\n" not in message and message.startswith("data=cifar100: no CIFAR-100 files under ")
    assert str(tmp_path / "cifar-100-python") in message and "data.download" in message
    assert "https://www.cs.toronto.edu/~kriz/cifar.html" in message
    assert info.value.__suppress_context__  # torchvision's traceback is hidden


@pytest.mark.parametrize("verify", [True, False])
def test_a_missing_file_is_named(tmp_path: Path, verify: bool) -> None:
    tff_files.write_cifar100(tmp_path, n_train=10, n_test=10)
    (tmp_path / "cifar-100-python" / "meta").unlink()
    with pytest.raises(DatasetNotFoundError, match=r"CIFAR-100 files missing under .*: meta;"):
        cifar100(root=tmp_path, verify_checksums=verify)


@pytest.mark.parametrize("name", ["train", "test", "meta"])
def test_a_truncated_pickle_is_named_with_what_to_do(tmp_path: Path, name: str) -> None:
    tff_files.write_cifar100(tmp_path, n_train=10, n_test=10)
    path = tmp_path / "cifar-100-python" / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # an interrupted download or copy; before: UnpicklingError, no file named
    with pytest.raises(DatasetNotFoundError) as info:
        cifar100(root=tmp_path, verify_checksums=False)
    message = str(info.value)
    assert "\n" not in message and info.value.__suppress_context__
    assert message.startswith(f"data=cifar100: cannot read {path} (UnpicklingError: pickle data was truncated); ")
    assert "delete it and download it again (rerun with data.download=true" in message


def test_failed_download_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr("torchvision.datasets.cifar.download_and_extract_archive", no_network)
    with pytest.raises(DatasetNotFoundError) as info:
        cifar100(root=tmp_path, download=True)
    message = str(info.value)
    assert "\n" not in message and "could not download CIFAR-100" in message and "Name or service" in message


def test_conf_option_loads_the_files(tmp_path: Path) -> None:
    overrides = tff_files.write_cifar100(tmp_path, n_train=60, n_test=20)
    split = instantiate(compose(["data=cifar100", *overrides]).data)
    assert isinstance(split, DataSplit) and (len(split.train), len(split.test)) == (60, 20)
    assert split.train.num_classes == 100 and split.train.input_shape == (3, 32, 32)
