"""fedsim.data.leaf: the four LEAF datasets read from tiny folders in LEAF's real JSON layout (2 train files, 1 test
file): pooled layout, values as in the files, LEAF's per-user split kept by partition=natural, the one-line errors
for damaged folders, the conf options and one training round."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/data holds leaf_files

import leaf_files  # noqa: E402

from fedsim.cli.run import build_server, compose  # noqa: E402
from fedsim.client.federation import federate  # noqa: E402
from fedsim.data import leaf  # noqa: E402
from fedsim.data.partition import iid, natural  # noqa: E402
from fedsim.data.tensor_data import DataSplit  # noqa: E402
from fedsim.data.text import character_ids, encode_words, most_frequent_words  # noqa: E402
from fedsim.data.vision import DatasetNotFoundError  # noqa: E402

NAMES = ("femnist", "shakespeare", "sent140", "celeba")
SHAPES = {
    "femnist": ((1, 28, 28), torch.float32, 62),
    "shakespeare": ((80,), torch.int64, 81),
    "sent140": ((25,), torch.int64, 2),
    "celeba": ((3, 16, 16), torch.float32, 2),
}


def _load(name: str, root: Path, **options: Any) -> DataSplit:
    if name == "celeba":
        options.setdefault("image_size", 16)
    return getattr(leaf, name)(root=root, **options)


LEAF_ALL_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"  # LEAF's


def _expected_x(name: str, xs: list, root: Path) -> torch.Tensor:
    """What the loader must give for one user's ``x`` list (an independent reading where the format allows)."""
    if name == "femnist":
        return torch.tensor(xs, dtype=torch.float32).view(-1, 1, 28, 28)
    if name == "shakespeare":
        return torch.tensor([[_leaf_id(c) for c in window] for window in xs])
    if name == "sent140":
        return torch.from_numpy(encode_words([row[4] for row in xs], _train_vocabulary(root), 25))
    folder = leaf_files.leaf_folder(root, "celeba") / "raw" / "img_align_celeba"
    images = [np.asarray(Image.open(folder / f).convert("RGB").resize((16, 16), Image.Resampling.BICUBIC)) for f in xs]
    return (torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255 - 0.5) / 0.5


def _leaf_id(c: str) -> int:
    """LEAF's letter_to_index, with its -1 for other characters turned into the documented id 80."""
    i = LEAF_ALL_LETTERS.find(c)
    return 80 if i < 0 else i


def _train_vocabulary(root: Path) -> dict[str, int]:
    written = leaf_files.read_leaf_folder(leaf_files.leaf_folder(root, "sent140"))
    return most_frequent_words([row[4] for xs, _ in written["train"].values() for row in xs], 10002)


def _expected_y(name: str, ys: list) -> list[int]:
    return character_ids(ys).tolist() if name == "shakespeare" else ys


@pytest.mark.parametrize("name", NAMES)
def test_pooled_layout_with_every_users_rows_as_in_the_files(tmp_path: Path, name: str) -> None:
    leaf_files.write_leaf(tmp_path, name, 30, 10)
    split = _load(name, tmp_path)
    shape, dtype, classes = SHAPES[name]
    train, test = split.train, split.test
    assert train.input_shape == shape and train.x.dtype == dtype and train.y.dtype == torch.int64
    assert train.num_classes == test.num_classes == classes
    assert split.local_test.tolist() == [False] * 30 + [True] * 10
    assert test.x.data_ptr() == train.x[30:].data_ptr() and len(test) == 10  # a view of the tail: no copy
    written = leaf_files.read_leaf_folder(leaf_files.leaf_folder(tmp_path, name))
    rows = 0
    for part in ("train", "test"):
        users = sorted(written[part])  # users in sorted order within each part, rows in file order
        counts = [len(written[part][u][1]) for u in users]
        assert train.groups[rows : rows + sum(counts)].tolist() == np.repeat(users, counts).tolist()
        for user, n in zip(users, counts, strict=True):
            xs, ys = written[part][user]
            assert torch.allclose(train.x[rows : rows + n], _expected_x(name, xs, tmp_path), atol=1e-6)
            assert train.y[rows : rows + n].tolist() == _expected_y(name, ys)
            rows += n
    assert rows == len(train)


@pytest.mark.parametrize("name", NAMES)
def test_natural_partition_keeps_leafs_per_user_split(tmp_path: Path, name: str) -> None:
    written = leaf_files.write_leaf(tmp_path, name, 30, 10)
    split = _load(name, tmp_path)
    data = federate(split, functools.partial(natural), client_test_fraction=0.2, seed=0)
    users = sorted(written["train"])
    assert data.num_clients == 4
    for client, user in enumerate(users):  # client i is the i-th user id
        for part, rows in (("train", data.client_train[client]), ("test", data.client_test[client])):
            xs, ys = written[part][user]
            assert torch.allclose(split.train.x[rows], _expected_x(name, xs, tmp_path), atol=1e-6)
            assert split.train.y[rows].tolist() == _expected_y(name, ys)
            assert set(split.train.groups[rows]) <= {user}


def test_other_partitioners_divide_the_training_rows_only(tmp_path: Path) -> None:
    leaf_files.write_leaf(tmp_path, "femnist", 30, 10)
    split = leaf.femnist(root=tmp_path)
    data = federate(split, functools.partial(iid, num_clients=3), client_test_fraction=0.2, seed=0)
    assert np.array_equal(np.sort(np.concatenate(data.client_train + data.client_test)), np.arange(30))


def test_sent140_vocabulary_comes_from_the_training_tweets_only(tmp_path: Path) -> None:
    leaf_files.write_leaf(tmp_path, "sent140", 30, 10)
    test_file = leaf_files.leaf_folder(tmp_path, "sent140") / "test" / "all_data_0_niid_0_keep_0_test_9.json"
    data = json.loads(test_file.read_text())
    user = sorted(data["users"])[0]
    data["user_data"][user]["x"][0][4] = "zebra zebra zebra love"
    test_file.write_text(json.dumps(data))
    split = leaf.sent140(root=tmp_path, max_words=6)
    first_test_row = split.train.x[30].tolist()
    assert first_test_row[:3] == [1, 1, 1] and first_test_row[3] > 1 and first_test_row[4:] == [0, 0]
    small = leaf.sent140(root=tmp_path, vocab_size=4)  # the 2 most frequent training words
    assert int(small.train.x.max()) == 3 and (small.train.x == 1).any()


def test_sent140_with_glove_uses_the_files_words_in_file_order(tmp_path: Path) -> None:
    leaf_files.write_leaf(tmp_path, "sent140", 30, 10)
    glove = tmp_path / "glove.txt"
    glove.write_text("the 0.1 0.2\nlove 0.3 0.4\nhate 0.5 0.6\nday 0.7 0.8\n")
    split = leaf.sent140(root=tmp_path, glove=glove, vocab_size=None)
    written = leaf_files.read_leaf_folder(leaf_files.leaf_folder(tmp_path, "sent140"))
    tweets = [row[4] for part in ("train", "test") for u in sorted(written[part]) for row in written[part][u][0]]
    expected = encode_words(tweets, {"the": 2, "love": 3, "hate": 4, "day": 5}, 25)
    assert split.train.x.tolist() == expected.tolist()
    assert int(leaf.sent140(root=tmp_path, glove=glove, vocab_size=4).train.x.max()) == 3  # first 2 lines only


def test_files_with_user_data_first_are_read_the_same(tmp_path: Path) -> None:
    leaf_files.write_leaf(tmp_path, "shakespeare", 30, 10)
    before = leaf.shakespeare(root=tmp_path)
    for path in leaf_files.leaf_folder(tmp_path, "shakespeare").glob("*/*.json"):
        data = json.loads(path.read_text())
        path.write_text(
            json.dumps({"user_data": data["user_data"], "num_samples": data["num_samples"], "users": data["users"]})
        )
    after = leaf.shakespeare(root=tmp_path)
    assert torch.equal(before.train.x, after.train.x) and before.train.groups.tolist() == after.train.groups.tolist()


def _one_line(info: pytest.ExceptionInfo, *parts: str) -> str:
    message = str(info.value)
    assert "\n" not in message, message
    for part in parts:
        assert part in message, (part, message)
    return message


def test_missing_folder_names_leaf_and_the_preprocessing_command(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        leaf.femnist(root=tmp_path)
    _one_line(
        info,
        str(tmp_path / "leaf" / "femnist" / "data" / "train"),
        "https://github.com/TalwalkarLab/leaf",
        "./preprocess.sh -s niid --sf 1.0 -k 0 -t sample",
        "data.folder",
    )
    leaf_files.write_leaf(tmp_path, "femnist", 8, 4)
    for path in (leaf_files.leaf_folder(tmp_path, "femnist") / "test").glob("*.json"):
        path.unlink()
    with pytest.raises(DatasetNotFoundError) as info:
        leaf.femnist(root=tmp_path)
    _one_line(info, "no LEAF .json files in " + str(leaf_files.leaf_folder(tmp_path, "femnist") / "test"))


def test_folder_option_points_elsewhere(tmp_path: Path) -> None:
    leaf_files.write_leaf(tmp_path / "elsewhere", "femnist", 8, 4)
    split = leaf.femnist(root=tmp_path / "nothing", folder=leaf_files.leaf_folder(tmp_path / "elsewhere", "femnist"))
    assert len(split.train) == 12


TRAIN0 = "train/all_data_0_niid_0_keep_0_train_9.json"


def _edit(data: dict[str, Any], change: str) -> None:
    user = data["users"][0]
    entry = data["user_data"][user]
    if change == "no_users":
        del data["users"]
    elif change == "no_user_data":
        del data["user_data"]
    elif change == "counts":
        data["num_samples"] = data["num_samples"][:-1]
    elif change == "user_missing":
        del data["user_data"][user]
    elif change == "no_y":
        del entry["y"]
    elif change == "x_y_differ":
        entry["y"] = entry["y"][:-1]
    elif change == "num_samples":
        data["num_samples"][0] += 1
    elif change == "short_row":
        entry["x"][1] = entry["x"][1][:783]
    elif change == "bad_label":
        entry["y"][0] = 62


@pytest.mark.parametrize(
    ("change", "error", "expected"),
    [
        ("no_users", ValueError, "has no 'users' list"),
        ("no_user_data", ValueError, "has no 'user_data' object"),
        ("counts", ValueError, "lists 2 users but 1 num_samples"),
        ("user_missing", ValueError, "user 'f0003_21' is listed in 'users' but has no entry in 'user_data'"),
        ("no_y", ValueError, "user 'f0003_21' has no 'y' list"),
        ("x_y_differ", ValueError, "user 'f0003_21' has 2 x and 1 y but num_samples says 2"),
        ("num_samples", ValueError, "user 'f0003_21' has 2 x and 2 y but num_samples says 3"),
        ("short_row", ValueError, "user 'f0003_21', row 1 has 783 pixel values; FEMNIST rows must have 784"),
        ("bad_label", ValueError, "user 'f0003_21', row 0 has label 62; labels must be 0..61"),
    ],
)
def test_damaged_files_are_one_line_errors_naming_file_and_user(
    tmp_path: Path, change: str, error: type, expected: str
) -> None:
    leaf_files.write_leaf(tmp_path, "femnist", 24, 4)
    path = leaf_files.leaf_folder(tmp_path, "femnist") / TRAIN0
    data = json.loads(path.read_text())
    _edit(data, change)
    path.write_text(json.dumps(data))
    with pytest.raises(error) as info:
        leaf.femnist(root=tmp_path)
    _one_line(info, f"data=femnist: {path}", expected)


@pytest.mark.parametrize(("field", "value", "shown"), [("x", "nan", "nan"), ("x", "-inf", "-inf"), ("y", "inf", "inf")])
def test_a_non_finite_pixel_or_label_is_refused_naming_file_user_and_row(
    tmp_path: Path, field: str, value: str, shown: str
) -> None:
    leaf_files.write_leaf(tmp_path, "femnist", 24, 4)
    path = leaf_files.leaf_folder(tmp_path, "femnist") / TRAIN0
    data = json.loads(path.read_text())
    user = data["users"][1]
    entry = data["user_data"][user]
    if field == "x":
        entry["x"][4][300] = float(value)
    else:
        entry["y"][4] = float(value)
    path.write_text(json.dumps(data))  # Python's json writes NaN, Infinity, -Infinity (and reads them back)
    with pytest.raises(ValueError) as info:
        leaf.femnist(root=tmp_path)
    assert str(info.value) == (
        f"data: {path}: {field} has a non-finite value ({shown}) at row 4 (client {user!r}); fix or drop that row"
    )


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_unparsable_json_names_the_file(tmp_path: Path, damage: str) -> None:
    leaf_files.write_leaf(tmp_path, "femnist", 12, 4)
    path = leaf_files.leaf_folder(tmp_path, "femnist") / TRAIN0
    text = path.read_text()
    path.write_text(text[: len(text) // 2] if damage == "truncate" else "<html>not json</html>")
    with pytest.raises(DatasetNotFoundError) as info:
        leaf.femnist(root=tmp_path)
    _one_line(info, f"cannot parse {path} as JSON", "preprocess.sh")


def test_a_file_that_is_not_utf8_names_the_file_and_the_line(tmp_path: Path) -> None:
    leaf_files.write_leaf(tmp_path, "femnist", 12, 4)
    path = leaf_files.leaf_folder(tmp_path, "femnist") / TRAIN0
    lines = json.dumps(json.loads(path.read_text()), indent=1).encode().split(b"\n")
    assert lines[2].startswith(b'  "f')  # line 3: the first user's name
    lines[2] = lines[2].replace(b'"f', b'"\xe9f', 1)  # Latin-1's é before it
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(ValueError) as info:
        leaf.femnist(root=tmp_path)
    _one_line(info, f"data: {path} line 3 is not UTF-8 text (byte 0xe9, the line's byte 4); re-encode the file")


def test_a_user_twice_in_one_part_is_refused(tmp_path: Path) -> None:
    leaf_files.write_leaf(tmp_path, "femnist", 12, 4)
    train = leaf_files.leaf_folder(tmp_path, "femnist") / "train"
    (train / "copy_of_0.json").write_text((train / "all_data_0_niid_0_keep_0_train_9.json").read_text())
    with pytest.raises(ValueError) as info:
        leaf.femnist(root=tmp_path)
    _one_line(
        info,
        "user 'f0003_21' is in two train files",
        str(train / "all_data_0_niid_0_keep_0_train_9.json"),
        str(train / "copy_of_0.json"),
    )


def test_text_and_image_rows_of_the_wrong_kind_are_named(tmp_path: Path) -> None:
    leaf_files.write_leaf(tmp_path, "shakespeare", 24, 4)
    path = leaf_files.leaf_folder(tmp_path, "shakespeare") / TRAIN0
    data = json.loads(path.read_text())
    data["user_data"][data["users"][0]]["y"][0] = "ab"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as info:
        leaf.shakespeare(root=tmp_path)
    _one_line(info, f"{path}: user 'THE_TRAGEDY_OF_HAMLET_03_21'", "'ab', not a single character")
    leaf_files.write_leaf(tmp_path, "sent140", 24, 4)
    path = leaf_files.leaf_folder(tmp_path, "sent140") / TRAIN0
    data = json.loads(path.read_text())
    data["user_data"][data["users"][0]]["x"][1] = "just text"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as info:
        leaf.sent140(root=tmp_path)
    _one_line(info, f"{path}: user 'tweeter003_21', row 1", "[tweet id, date, query, user, text]")


def test_celeba_normalisation_constants_must_be_finite() -> None:
    from fedsim.data.leaf_images import read_images

    with pytest.raises(ValueError, match=r"data: image_std must be finite numbers, got \[0.5, inf, 0.5\]"):
        read_images([], 16, mean=0.5, std=[0.5, float("inf"), 0.5], source="nowhere")


def test_missing_celeba_images_are_named(tmp_path: Path) -> None:
    leaf_files.write_leaf(tmp_path, "celeba", 12, 4)
    images = leaf_files.leaf_folder(tmp_path, "celeba") / "raw" / "img_align_celeba"
    path = leaf_files.leaf_folder(tmp_path, "celeba") / TRAIN0
    first = json.loads(path.read_text())
    name = first["user_data"][first["users"][0]]["x"][0]
    (images / name).unlink()
    with pytest.raises(DatasetNotFoundError) as info:
        leaf.celeba(root=tmp_path)
    _one_line(info, f"{path}: user '000321', row 0 names the image '{name}'", str(images), "mmlab.ie.cuhk.edu.hk")
    (images / name).write_bytes(b"\xff\xd8 not really a jpeg")
    with pytest.raises(DatasetNotFoundError) as info:
        leaf.celeba(root=tmp_path, image_size=8)
    _one_line(info, f"cannot read the image {images / name}")
    for image in images.iterdir():
        image.unlink()
    images.rmdir()
    with pytest.raises(DatasetNotFoundError) as info:
        leaf.celeba(root=tmp_path)
    _one_line(info, f"no image folder {images}", "data.image_folder")


@pytest.mark.parametrize("name", NAMES)
def test_conf_options_load_the_writers_files(tmp_path: Path, name: str) -> None:
    overrides = getattr(leaf_files, f"write_{name}")(tmp_path, 20, 8)
    cfg = compose([f"data={name}", *overrides])
    split = instantiate(cfg.data)
    assert isinstance(split, DataSplit) and len(split.train) == 28 and len(split.test) == 8
    assert len(np.unique(split.train.groups)) >= 3 and split.train.input_shape == SHAPES[name][0]


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("femnist", ["model=logreg"]),
        ("celeba", ["model=logreg"]),
        ("shakespeare", ["model=char_lstm", "model.hidden=8", "model.num_layers=1"]),  # logreg cannot read token ids
    ],
)
def test_one_training_round_with_each_user_as_a_client(tmp_path: Path, name: str, model: list[str]) -> None:
    overrides = getattr(leaf_files, f"write_{name}")(tmp_path, 20, 8)
    cfg = compose(
        [
            f"data={name}",
            *overrides,
            "partition=natural",
            *model,
            "num_rounds=1",
            "clients_per_round=4",
            "logger=quiet",
            "evaluate_clients=all",
        ]
    )
    server = build_server(cfg)
    assert [len(c.test_indices) for c in server.clients] == leaf_files.uneven_sizes(8, 4)[
        ::-1
    ]  # each user's own test rows
    result = server.run()
    assert result.history[-1]["eval_global/clients"] == 4
    assert 0 <= result.history[-1]["eval/accuracy"] <= 1
