"""Hugging Face ``datasets`` copies (``save_to_disk`` folders, parquet files) read offline by ``data=hf`` and its
presets, from tiny copies written in tmp_path with ``datasets`` itself (see hf_files.py)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/data holds the hf_files writers

import hf_files  # noqa: E402

from fedsim.data.tensor_data import DataSplit  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FEMNIST = {"client_column": "writer_id", "feature_column": "image", "label_column": "character"}
SHAKESPEARE = {"client_column": "character_id", "feature_column": "x", "label_column": "y", "text_length": 80}


@pytest.fixture()
def datasets() -> Any:
    """The ``datasets`` package (the optional extra); tests that write copies skip without it."""
    return pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def femnist_copy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A flwrlabs/femnist-like ``save_to_disk`` folder (one "train" split) of 62 rows by 4 writers, and its rows."""
    pytest.importorskip("datasets")
    folder = tmp_path_factory.mktemp("hf") / "femnist"
    ds = hf_files.femnist_dataset(62, writers=4)
    ds.save_to_disk(str(folder))
    return folder, ds


def _load(**options: Any) -> DataSplit:
    from fedsim.data.hf import hf

    return hf(**{"seed": 0, **options})


def _source(ds: Any) -> dict[str, np.ndarray]:
    """The written rows as arrays: images (uint8), labels, writers."""
    return {
        "images": np.stack([np.asarray(im) for im in ds["image"]]),
        "labels": np.asarray(ds["character"]),
        "writers": np.asarray(ds["writer_id"]),
    }


def test_without_datasets_the_option_says_how_to_install_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['datasets'] = None; sys.modules['pyarrow'] = None  # as if the extra were not installed\n"
        "from fedsim.data.hf import hf\n"
        "try:\n"
        "    hf(path='x', client_column='a', feature_column='b', label_column='c', seed=0)\n"
        "except ValueError as err:\n"
        "    print(type(err).__name__, isinstance(err, ImportError)); print(err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    kind, message = out.stdout.splitlines()
    assert kind == "MissingExtraError True"
    assert message == (
        "a Hugging Face dataset (data=hf, femnist_hf, shakespeare_hf) needs the datasets package: "
        "pip install 'fedsim-torch[hf]' (in a source checkout: pip install -e '.[hf]'; or pip install datasets)"
    )


def test_save_to_disk_copy_keeps_every_writers_rows_and_pixels(femnist_copy: tuple[Path, Any]) -> None:
    folder, ds = femnist_copy
    split = _load(path=folder, **FEMNIST)
    src = _source(ds)
    assert split.train.x.shape == (62, 1, 28, 28) and split.train.x.dtype == torch.float32
    assert split.train.num_classes == 62  # from the ClassLabel, though only some labels occur
    rows = hf_files.source_rows(split.train.x)
    assert sorted(rows.tolist()) == list(range(62))  # every row once: train and test parts are disjoint
    assert torch.equal(split.train.x[:, 0], torch.from_numpy(src["images"][rows]).float() / 255)  # LEAF scale
    assert split.train.y.tolist() == src["labels"][rows].tolist()
    assert split.train.groups.tolist() == src["writers"][rows].tolist()
    assert Counter(split.train.groups.tolist()) == Counter(src["writers"].tolist())


def test_each_writer_keeps_leafs_share_of_its_rows_for_testing(femnist_copy: tuple[Path, Any]) -> None:
    split = _load(path=femnist_copy[0], test_fraction=0.1, **FEMNIST)
    n_train = int((~split.local_test).sum())
    assert split.local_test[n_train:].all()  # pooled layout: training rows first, test rows last
    tested = Counter(split.train.groups[split.local_test].tolist())
    assert tested == {"f0000_00": 2, "f0001_01": 2, "f0002_02": 2, "f0003_03": 2}  # 16 -> 14 + 2, 15 -> 13 + 2
    assert split.test.x.data_ptr() == split.train.x[n_train:].data_ptr()  # the test set is a view of the tail
    assert split.test.groups.tolist() == split.train.groups[n_train:].tolist()


def test_the_per_writer_split_depends_only_on_the_seed(femnist_copy: tuple[Path, Any]) -> None:
    def tested_rows(seed: int) -> set[int]:
        split = _load(path=femnist_copy[0], **{**FEMNIST, "seed": seed})
        return set(hf_files.source_rows(split.test.x).tolist())

    assert tested_rows(3) == tested_rows(3)
    assert tested_rows(3) != tested_rows(4)


def test_local_test_rows_follow_leafs_per_user_rule() -> None:
    from fedsim.data.hf import local_test_rows

    owners = np.random.default_rng(0).permutation(np.repeat(["a", "b", "c", "d"], [1, 2, 10, 25]))
    for fraction, expected in ((0.1, {"b": 1, "c": 1, "d": 3}), (0.5, {"b": 1, "c": 5, "d": 13})):
        mask = local_test_rows(owners, fraction, seed=0)
        assert Counter(owners[mask].tolist()) == expected  # n - max(1, floor((1 - f) n)); "a" (1 row) only trains


def test_parquet_repository_folder_with_a_test_split(datasets: Any, tmp_path: Path) -> None:
    data = tmp_path / "femnist" / "data"
    data.mkdir(parents=True)
    hf_files.femnist_dataset(30).to_parquet(str(data / "train-00000-of-00001.parquet"))
    hf_files.femnist_dataset(9, first_row=30).to_parquet(str(data / "test-00000-of-00001.parquet"))
    split = _load(path=tmp_path / "femnist", test_split="test", cache_dir=str(tmp_path / "cache"), **FEMNIST)
    assert len(split.train) == 39 and len(split.test) == 9
    assert split.local_test.tolist() == [False] * 30 + [True] * 9  # each writer tests on its own test rows
    assert hf_files.source_rows(split.test.x).tolist() == list(range(30, 39))
    assert split.test.groups.tolist() == hf_files.writers_of(9, 3)


@pytest.mark.parametrize("how", ["file", "glob"])
def test_parquet_file_or_glob_is_the_training_split(datasets: Any, tmp_path: Path, how: str) -> None:
    hf_files.femnist_dataset(20).to_parquet(str(tmp_path / "part-0.parquet"))
    hf_files.femnist_dataset(20, first_row=20).to_parquet(str(tmp_path / "part-1.parquet"))
    path = tmp_path / "part-0.parquet" if how == "file" else tmp_path / "part-*.parquet"
    split = _load(path=path, cache_dir=str(tmp_path / "cache"), **FEMNIST)
    rows = 20 if how == "file" else 40
    assert sorted(hf_files.source_rows(split.train.x).tolist()) == list(range(rows))


def test_rgb_images_are_normalised_per_channel(datasets: Any, tmp_path: Path) -> None:
    from PIL import Image

    pixels = np.random.default_rng(1).integers(0, 256, size=(6, 5, 7, 3), dtype=np.uint8)  # height 5, width 7
    ds = datasets.Dataset.from_dict(
        {"img": [Image.fromarray(p, mode="RGB") for p in pixels], "user": [0, 0, 1, 1, 2, 2], "label": [0, 1] * 3},
        features=datasets.Features(
            {"img": datasets.Image(), "user": datasets.Value("int64"), "label": datasets.Value("int64")}
        ),
    )
    ds.save_to_disk(str(tmp_path / "rgb"))
    mean, std = [0.5, 0.4, 0.3], [0.25, 0.2, 0.1]
    split = _load(
        path=tmp_path / "rgb",
        client_column="user",
        feature_column="img",
        label_column="label",
        test_fraction=0.5,
        image_mean=mean,
        image_std=std,
    )
    assert split.train.x.shape == (6, 3, 5, 7) and split.train.num_classes == 2
    expected = (
        torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)
    ) / torch.tensor(std).view(1, 3, 1, 1)
    matched = [int(torch.isclose(expected, row, atol=1e-5).flatten(1).all(1).nonzero()[0]) for row in split.train.x]
    assert sorted(matched) == list(range(6))
    assert split.train.groups.tolist() == [[0, 0, 1, 1, 2, 2][i] for i in matched]


def test_a_test_split_without_the_client_column_is_the_servers_only(datasets: Any, tmp_path: Path) -> None:
    overrides = hf_files.write_hf(tmp_path, 12, 6)
    options = dict(o.removeprefix("data.").split("=", 1) for o in overrides)
    split = _load(**options)
    assert split.local_test is None and split.test.groups is None
    assert split.train.x.dtype == torch.float32 and split.train.x.shape == (12, 8)
    assert split.train.num_classes == 4  # the largest integer label + 1
    written = datasets.load_from_disk(str(tmp_path / "hf"))
    assert torch.equal(split.test.x, torch.tensor(written["test"]["features"]))
    assert split.train.groups.tolist() == written["train"]["user"]


def test_string_columns_become_leaf_character_ids(datasets: Any, tmp_path: Path) -> None:
    from fedsim.data.text import character_ids, encode_characters

    ds = hf_files.shakespeare_dataset(30)
    ds.save_to_disk(str(tmp_path / "play"))
    split = _load(path=tmp_path / "play", **SHAKESPEARE)
    assert split.train.x.dtype == torch.int64 and split.train.x.shape == (30, 80)
    assert split.train.num_classes == 81  # LEAF's 80 characters and the unknown one
    expected = zip(
        ds["character_id"], encode_characters(ds["x"], 80).tolist(), character_ids(ds["y"]).tolist(), strict=True
    )
    got = zip(split.train.groups.tolist(), split.train.x.tolist(), split.train.y.tolist(), strict=True)
    assert sorted(got) == sorted(expected)
    assert Counter(split.train.groups[split.local_test].tolist()) == {f"THE_PLAY_ROLE_{i}": 1 for i in range(3)}


@pytest.mark.parametrize(("bad_split", "row", "value"), [("train", 17, "nan"), ("test", 4, "-inf")])
def test_a_non_finite_feature_is_refused_naming_split_column_row_and_client(
    datasets: Any, tmp_path: Path, bad_split: str, row: int, value: str
) -> None:
    parts = {"train": hf_files.numeric_dataset(30), "test": hf_files.numeric_dataset(12, first_row=30)}
    part = parts[bad_split]
    features = np.array(part["features"], dtype=np.float32)
    features[row, 5] = float(value)
    columns = {"features": features.tolist(), "label": part["label"], "user": part["user"]}
    parts[bad_split] = datasets.Dataset.from_dict(columns, features=part.features)
    datasets.DatasetDict(parts).save_to_disk(str(tmp_path / "copy"))
    options = {"path": tmp_path / "copy", "client_column": "user", "feature_column": "features"}
    # without test_split every user's rows are shuffled into its train and test part: the row named is the split's own
    for test_split in (None, "test") if bad_split == "train" else ("test",):
        with pytest.raises(ValueError) as info:
            _load(**options, label_column="label", test_split=test_split)
        assert str(info.value) == (
            f"data: split {bad_split!r} of {tmp_path / 'copy'}: column 'features' has a non-finite value ({value}) "
            f"at row {row} (client {row % 3}); fix or drop that row"
        )


WRITERS = {
    "femnist_hf": hf_files.write_femnist_hf,
    "shakespeare_hf": hf_files.write_shakespeare_hf,
    "hf": hf_files.write_hf,
}


@pytest.mark.parametrize("option", sorted(WRITERS))
def test_writers_give_exactly_the_asked_rows_through_the_option(datasets: Any, tmp_path: Path, option: str) -> None:
    from hydra.utils import instantiate

    from fedsim.cli.run import compose

    overrides = WRITERS[option](tmp_path, 12, 6)
    split = instantiate(compose([f"data={option}", *overrides]).data)
    local = np.zeros(len(split.train), dtype=bool) if split.local_test is None else split.local_test
    assert int((~local).sum()) == 12 and len(split.test) == 6
    assert len(set(split.train.groups.tolist())) >= 3


def _empty_folder(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "empty").mkdir()
    return {"path": tmp_path / "empty"}


def _csv_file(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "rows.csv").write_text("a,b\n1,2\n")
    return {"path": tmp_path / "rows.csv"}


def _garbage_parquet(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    return {"path": tmp_path / "bad.parquet", "cache_dir": str(tmp_path / "cache")}


def _odd_columns(tmp_path: Path) -> dict[str, Any]:
    import datasets

    ds = datasets.Dataset.from_dict({"flag": [True, False] * 3, "score": [0.5] * 6, "w": list("aabbcc")})
    ds.save_to_disk(str(tmp_path / "odd"))
    return {"path": tmp_path / "odd", "client_column": "w", "feature_column": "flag", "label_column": "score"}


def _ragged(tmp_path: Path) -> dict[str, Any]:
    import datasets

    ds = datasets.Dataset.from_dict({"v": [[1.0], [3.0, 4.0], [1.0, 2.0]], "u": [0, 0, 1], "y": [0, 1, 1]})
    ds.save_to_disk(str(tmp_path / "ragged"))
    return {
        "path": tmp_path / "ragged",
        "client_column": "u",
        "feature_column": "v",
        "label_column": "y",
        "test_fraction": 0.5,
    }


def _mixed_sizes(tmp_path: Path) -> dict[str, Any]:
    import datasets
    from PIL import Image

    images = [Image.new("L", (28, 28)), Image.new("L", (30, 28))] * 2
    features = datasets.Features(
        {"image": datasets.Image(), "writer_id": datasets.Value("string"), "character": datasets.Value("int64")}
    )
    ds = datasets.Dataset.from_dict(
        {"image": images, "writer_id": list("aabb"), "character": [0, 1, 2, 3]}, features=features
    )
    ds.save_to_disk(str(tmp_path / "mixed"))
    return {"path": tmp_path / "mixed", "test_fraction": 0.5}


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda p: {"path": p / "nowhere", "hub_id": "flwrlabs/femnist"},
            FileNotFoundError,
            r"no Hugging Face dataset at .*nowhere \(data.path\); on a machine with internet run "
            r"datasets.load_dataset\('flwrlabs/femnist'\).save_to_disk\('.*nowhere'\) \(or download the parquet files "
            r"of https://huggingface.co/datasets/flwrlabs/femnist\)",
        ),
        (lambda p: {"path": p / "*.parquet"}, FileNotFoundError, r"no Hugging Face dataset at .*\*.parquet"),
        (_empty_folder, ValueError, r"empty is neither a datasets save_to_disk folder .* nor a folder of .parquet"),
        (_csv_file, ValueError, r"rows.csv is not a .parquet file"),
        (_garbage_parquet, ValueError, r"cannot read .*bad.parquet with datasets \("),
        (
            lambda p: {"client_column": "writer"},
            ValueError,
            r"split 'train' of .*femnist has no column 'writer' \(data.client_column\); "
            r"its columns: image, writer_id, hsf_id, character",
        ),
        (lambda p: {"label_column": "label"}, ValueError, r"no column 'label' \(data.label_column\)"),
        (
            lambda p: {"test_split": "validation"},
            ValueError,
            r"has no split 'validation' \(it has: train\); set data.test_split",
        ),
        (
            lambda p: {"feature_column": "hsf_id", "label_column": "writer_id"},
            ValueError,
            r"label column 'writer_id' holds strings that are not single characters \(row 0: 'f0000_00'\)",
        ),
        (lambda p: {"test_fraction": 1.0}, ValueError, r"data.test_fraction must be in \(0, 1\) \(got 1.0\)"),
        (lambda p: {"num_classes": 10}, ValueError, r"a label is \d+ but num_classes is 10"),
        (lambda p: {"image_std": [0.5, 0.5]}, ValueError, r"data.image_std has 2 values but the images have 1"),
        (lambda p: {"image_mean": float("nan")}, ValueError, r"data.image_mean must be finite numbers \(got \[nan\]\)"),
        (_odd_columns, ValueError, r"feature column 'flag' is Value\('bool'\), which fedsim cannot read as features"),
        (_ragged, ValueError, r"column 'v': rows hold arrays of different lengths .*; every row needs the same shape"),
        (_mixed_sizes, ValueError, r"row \d is (30x28|28x28) but row \d is (28x28|30x28); resize the images"),
    ],
)
def test_bad_copies_and_options_are_refused_in_one_line(
    femnist_copy: tuple[Path, Any],
    tmp_path: Path,
    make: Callable[[Path], dict[str, Any]],
    error: type,
    message: str,
) -> None:
    options = {"path": femnist_copy[0], **FEMNIST, **make(tmp_path)}
    with pytest.raises(error, match=message) as info:
        _load(**options)
    assert "\n" not in str(info.value)


def test_unsupported_label_type_is_named(datasets: Any, tmp_path: Path) -> None:
    options = _odd_columns(tmp_path) | {"feature_column": "score"}
    with pytest.raises(ValueError, match=r"label column 'score' is Value\('float64'\); fedsim reads labels from"):
        _load(**options)


def test_femnist_copy_trains_one_round_with_its_writers_as_clients(femnist_copy: tuple[Path, Any]) -> None:
    from fedsim.cli.run import build_server, compose

    cfg = compose(
        [
            "data=femnist_hf",
            f"data.path={femnist_copy[0]}",
            "partition=natural",
            "model=logreg",
            "num_rounds=1",
            "clients_per_round=4",
            "logger=quiet",
            "evaluate_clients=all",
        ]
    )
    server = build_server(cfg)
    assert [len(c.test_indices) for c in server.clients] == [2, 2, 2, 2]  # each writer's own test rows
    result = server.run()
    assert result.history[-1]["eval_global/clients"] == 4
    assert 0 <= result.history[-1]["eval/accuracy"] <= 1
