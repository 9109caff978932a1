"""Bring your own data: DataSplit.from_arrays, data=npz, data with its own per-client split (local_test), and the
start-up check that the model's output matches the data's classes."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch
from builders import tiny_server
from cli_runner import run_cli
from torch import nn

from fedsim.cli.run import build_server, compose
from fedsim.client.federation import federate
from fedsim.data.arrays import npz
from fedsim.data.partition import auto, iid, natural
from fedsim.data.tensor_data import DataSplit
from fedsim.models import LogisticRegression
from fedsim.server.server import Server


def _arrays(n_train: int = 90, n_test: int = 30, owners: int = 6, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x_train": rng.standard_normal((n_train, 5)).astype(np.float32),
        "y_train": np.arange(n_train) % 3,
        "x_test": rng.standard_normal((n_test, 5)).astype(np.float32),
        "y_test": np.arange(n_test) % 3,
        "client_ids": np.array([f"w{i % owners}" for i in range(n_train)]),
        "test_client_ids": np.array([f"w{i % owners}" for i in range(n_test)]),
    }


def test_from_arrays_uses_float32_arrays_without_a_copy_and_infers_the_classes() -> None:
    a = _arrays()
    split = DataSplit.from_arrays(a["x_train"], a["y_train"], a["x_test"], a["y_test"], client_ids=a["client_ids"])
    assert split.train.x.data_ptr() == a["x_train"].ctypes.data  # the caller's memory, not a copy
    assert split.train.num_classes == split.test.num_classes == 3 and split.local_test is None
    assert split.train.y.dtype == torch.int64 and list(split.train.groups) == list(a["client_ids"])
    tokens = DataSplit.from_arrays(
        np.ones((4, 7), dtype=np.int32), [0, 1, 0, 1], np.ones((2, 7), dtype=np.int32), [1, 0]
    )
    assert tokens.train.x.dtype == torch.int64  # integer features are token ids for text models


def test_natural_partition_keeps_each_owners_own_test_rows() -> None:
    a = _arrays()
    split = DataSplit.from_arrays(
        *(a[k] for k in ("x_train", "y_train", "x_test", "y_test")),
        client_ids=a["client_ids"],
        test_client_ids=a["test_client_ids"],
    )
    assert len(split.train) == 120 and len(split.test) == 30
    assert torch.equal(split.test.x, torch.from_numpy(a["x_test"]))  # the tail of the pool
    assert split.test.x.data_ptr() == split.train.x[90:].data_ptr()  # a view, not a second copy
    for partition in (functools.partial(natural), functools.partial(auto)):
        data = federate(split, partition, client_test_fraction=0.5, seed=0)
        assert data.num_clients == 6
        for i, owner in enumerate(sorted(set(a["client_ids"]))):
            assert sorted(data.client_train[i]) == [r for r in range(90) if a["client_ids"][r] == owner]
            assert sorted(data.client_test[i]) == [90 + r for r in range(30) if a["test_client_ids"][r] == owner]


def test_another_partitioner_divides_only_the_training_rows() -> None:
    a = _arrays()
    split = DataSplit.from_arrays(
        *(a[k] for k in ("x_train", "y_train", "x_test", "y_test")),
        client_ids=a["client_ids"],
        test_client_ids=a["test_client_ids"],
    )
    data = federate(split, functools.partial(iid, num_clients=4), client_test_fraction=0.2, seed=0)
    rows = np.concatenate(data.client_train + data.client_test)
    assert sorted(rows) == list(range(90))  # the owners' test rows stay in the centralized test set only
    assert [len(t) for t in data.client_test] == [
        round(0.2 * (len(a) + len(b))) for a, b in zip(data.client_train, data.client_test, strict=True)
    ]


def test_an_owner_without_training_rows_is_refused_in_one_line() -> None:
    a = _arrays()
    test_owners = a["test_client_ids"].astype(object)
    test_owners[0] = "only-tests"
    split = DataSplit.from_arrays(
        *(a[k] for k in ("x_train", "y_train", "x_test", "y_test")),
        client_ids=a["client_ids"],
        test_client_ids=test_owners,
    )
    with pytest.raises(ValueError, match=r"no training rows \(first: owner 'only-tests'\)") as info:
        federate(split, functools.partial(natural), client_test_fraction=0.2, seed=0)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"y_train": np.arange(89) % 3}, r"x_train has 90 rows but y_train has 89"),
        ({"y_test": np.full(30, 0.5)}, r"y_test must hold integer class indices"),
        ({"y_train": -np.ones(90, dtype=int)}, r"y_train has a negative label"),
        ({"x_test": np.zeros((30, 4), dtype=np.float32)}, r"x_train rows are \(5,\) .* x_test rows are \(4,\)"),
        ({"client_ids": np.zeros(10)}, r"client_ids must have one entry per example \(90\)"),
    ],
)
def test_bad_arrays_are_refused_in_one_line(change: dict[str, np.ndarray], message: str) -> None:
    a = _arrays() | change
    with pytest.raises(ValueError, match=message) as info:
        DataSplit.from_arrays(*(a[k] for k in ("x_train", "y_train", "x_test", "y_test")), client_ids=a["client_ids"])
    assert "\n" not in str(info.value)


def test_declared_classes_below_the_largest_label_are_refused() -> None:
    a = _arrays()
    with pytest.raises(ValueError, match="a label is 2 but num_classes is 2"):
        DataSplit.from_arrays(a["x_train"], a["y_train"], a["x_test"], a["y_test"], num_classes=2)


def test_npz_option_trains_one_round_with_the_owners_as_clients(tmp_path: Path) -> None:
    path = tmp_path / "mine.npz"
    np.savez(path, **_arrays())
    cfg = compose(
        [
            f"data.path={path}",
            "data=npz",
            "partition=natural",
            "clients_per_round=3",
            "num_rounds=1",
            "logger=quiet",
            "evaluate_clients=all",
        ]
    )
    server = build_server(cfg)
    assert [len(c.test_indices) for c in server.clients] == [5] * 6  # each owner's own test rows
    result = server.run()
    assert result.history[-1]["eval_global/clients"] == 6
    assert 0 <= result.history[-1]["eval/accuracy"] <= 1


def _write_garbage(path: Path) -> None:
    path.write_bytes(b"not a zip")


def _write_partial(path: Path) -> None:
    with open(path, "wb") as handle:
        np.savez(handle, x_train=np.zeros((2, 2)))


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (None, r"data=npz: no file .*mine.npz; set data.path"),
        (_write_garbage, r"data=npz: cannot read .*mine.npz as an .npz file"),
        (_write_partial, r"mine.npz has no y_train, x_test, y_test \(it holds x_train\)"),
    ],
)
def test_npz_file_problems_are_one_line_naming_the_file(tmp_path: Path, write, message: str) -> None:
    path = tmp_path / "mine.npz"
    if write is not None:
        write(path)
    with pytest.raises((ValueError, FileNotFoundError), match=message) as info:
        npz(path=path)
    assert "\n" not in str(info.value)


class _FixedOutput(nn.Module):
    """A user's model that ignores ``num_classes`` (always 4 scores)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(int(np.prod(input_shape)), 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


def _server_with(model_factory, split: DataSplit) -> Server:
    data = federate(split, functools.partial(iid, num_clients=3), client_test_fraction=0.2, seed=0)
    return tiny_server(data, model=model_factory, client=functools.partial(_client), num_rounds=1, clients_per_round=2)


def _client(**kwargs):
    from fedsim.client.base import Client

    return Client(**kwargs)


def test_a_model_whose_output_does_not_match_the_classes_is_refused_at_start_up() -> None:
    a = _arrays()
    a["y_train"] = np.arange(90) % 7  # 7 classes, the model gives 4 scores
    split = DataSplit.from_arrays(a["x_train"], a["y_train"], a["x_test"], a["y_test"])
    with pytest.raises(ValueError, match=r"_FixedOutput outputs \(4,\) scores per example but the data has 7 classes"):
        _server_with(functools.partial(_FixedOutput, (5,), 7), split)
    with pytest.raises(ValueError, match=r"LogisticRegression cannot take the data's examples of shape \(5,\)"):
        _server_with(functools.partial(LogisticRegression, (6,), 7), split)


def test_from_pool_keeps_the_pool_without_a_copy_and_each_owners_test_rows() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 3)).astype(np.float32)
    y, owners = np.arange(40) % 4, np.arange(40) % 5
    mask = np.zeros(40, dtype=bool)
    mask[::4] = True  # test rows spread through the pool
    split = DataSplit.from_pool(x, y, client_ids=owners, test_mask=mask)
    assert split.train.x.data_ptr() == x.ctypes.data and len(split.train) == 40
    assert torch.equal(split.test.x, torch.from_numpy(x[mask])) and list(split.test.groups) == list(owners[mask])
    data = federate(split, functools.partial(natural), client_test_fraction=0.3, seed=0)
    for owner in range(5):
        assert sorted(data.client_test[owner]) == [r for r in range(40) if mask[r] and owners[r] == owner]
        assert sorted(data.client_train[owner]) == [r for r in range(40) if not mask[r] and owners[r] == owner]
    tail = np.arange(40) >= 30
    assert (
        DataSplit.from_pool(x, y, client_ids=owners, test_mask=tail).test.x.data_ptr() == split.train.x[30:].data_ptr()
    )
    with pytest.raises(ValueError, match="test_mask must be boolean"):
        DataSplit.from_pool(x, y, client_ids=owners, test_mask=tail.astype(int))


def _nan_message(source: str, name: str, value: str, row: int, client: str) -> str:
    where = f"{source}: " if source else ""
    return f"data: {where}{name} has a non-finite value ({value}) at row {row} (client {client}); fix or drop that row"


@pytest.mark.parametrize(
    ("key", "dtype", "value", "shown"),
    [
        ("x_train", np.float32, np.nan, "nan"),
        ("x_test", np.float32, -np.inf, "-inf"),
        ("x_train", np.float64, 1e39, "inf"),  # finite in float64, infinite as the float32 features
        ("y_train", np.float64, np.nan, "nan"),  # before: "must hold integer class indices (found fractional values)"
    ],
)
def test_a_non_finite_value_in_an_npz_is_refused_naming_file_array_row_and_client(
    tmp_path: Path, key: str, dtype: type, value: float, shown: str
) -> None:
    a = _arrays()
    a[key] = a[key].astype(dtype)
    row = 61 if key != "x_test" else 23
    if key.startswith("x"):
        a[key][row, 3] = value
    else:
        a[key][row] = value
    path = tmp_path / "mine.npz"
    np.savez(path, **a)
    with pytest.raises(ValueError) as info:
        npz(path=path)
    owner = a["client_ids" if key != "x_test" else "test_client_ids"][row]
    assert str(info.value) == _nan_message(str(path), key, shown, row, repr(str(owner)))


def test_a_finite_npz_loads_bitwise_as_before(tmp_path: Path) -> None:
    """Features used as they are (no copy, no conversion), and extreme finite values pass: their sum overflows
    float32, so the quick test fails and the row search must find every value finite."""
    a = _arrays()
    for key in ("x_train", "x_test"):
        x = a[key]
        x[:, 0] = np.finfo(np.float32).max
        x[1::2, 1] = -np.finfo(np.float32).max
        x[:, 2] = np.finfo(np.float32).smallest_subnormal
        x[::3, 3] = -0.0
    assert not np.isfinite(torch.from_numpy(a["x_train"]).sum().item())
    path = tmp_path / "mine.npz"
    np.savez(path, **a)
    split = npz(path=path)
    with np.load(path) as stored:
        pool = np.concatenate([stored["x_train"], stored["x_test"]])
    assert split.train.x.dtype == torch.float32 and split.train.x.numpy().tobytes() == pool.tobytes()
    assert split.train.y.tolist() == a["y_train"].tolist() + a["y_test"].tolist()
    assert split.train.groups.tolist() == a["client_ids"].tolist() + a["test_client_ids"].tolist()
    plain = DataSplit.from_arrays(a["x_train"], a["y_train"], a["x_test"], a["y_test"], client_ids=a["client_ids"])
    assert plain.train.x.data_ptr() == a["x_train"].ctypes.data  # checked in place: no copy


def test_from_arrays_and_from_pool_refuse_a_non_finite_value_naming_array_row_and_client() -> None:
    a = _arrays()
    a["x_test"][11, 2] = np.inf
    with pytest.raises(ValueError) as info:
        DataSplit.from_arrays(
            *(a[k] for k in ("x_train", "y_train", "x_test", "y_test")),
            client_ids=a["client_ids"],
            test_client_ids=a["test_client_ids"],
        )
    assert str(info.value) == _nan_message("", "x_test", "inf", 11, "'w5'")
    labels = a["y_train"].astype(np.float64)
    labels[40] = np.nan  # before: "must hold integer class indices (found fractional values)"
    with pytest.raises(ValueError) as info:
        DataSplit.from_arrays(torch.from_numpy(a["x_train"]), labels, a["x_train"][:3], [0, 1, 2])
    assert str(info.value) == "data: y_train has a non-finite value (nan) at row 40; fix or drop that row"
    x = torch.zeros(40, 3, dtype=torch.float64)
    x[33, 0] = float("nan")
    with pytest.raises(ValueError) as info:
        DataSplit.from_pool(x, np.arange(40) % 4, client_ids=np.arange(40) % 5, test_mask=np.arange(40) >= 30)
    assert str(info.value) == _nan_message("", "x", "nan", 33, "3")
    tokens = DataSplit.from_arrays(np.ones((4, 7), dtype=np.int32), [0, 1, 0, 1], np.ones((2, 7), np.int32), [1, 0])
    assert tokens.train.x.dtype == torch.int64  # integer features are never searched for NaN


def test_the_npz_option_stops_in_one_line_before_training(tmp_path: Path) -> None:
    a = _arrays()
    a["x_train"][7, 1] = np.nan
    path = tmp_path / "bad.npz"
    np.savez(path, **a)
    result = run_cli(
        [
            "data=npz",
            f"data.path={path}",
            "partition=natural",
            "model=mlp",
            "num_rounds=1",
            "logger.progress=false",
            f"hydra.run.dir={tmp_path / 'run'}",
        ]
    )
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == ["fedsim: error: " + _nan_message(str(path), "x_train", "nan", 7, "'w1'")]
