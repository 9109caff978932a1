"""Partitioning text data by a category column (``data.category_column``): the rows' categories, sorted, are the
class ids that ``partition=dirichlet`` and ``shards`` split by, exactly as they split those ids given as labels; token
data without a column is refused in one line, and so is a row with a bad or missing category."""

from __future__ import annotations

import csv
import functools
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_cli

from fedsim.cli.run import label_counts
from fedsim.client.federation import federate
from fedsim.core.seeding import partition_seed
from fedsim.data.instructions import jsonl_classification, jsonl_instructions
from fedsim.data.partition import dirichlet, shards

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))  # tests/data: the writers of the LLM files

import llm_files  # noqa: E402

N_TRAIN, N_TEST = 60, 6


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The instruction files of :func:`llm_files.write_instructions` (a ``topic`` per row), as ``{key: value}``."""
    overrides = llm_files.write_instructions(tmp_path_factory.mktemp("llm"), N_TRAIN, N_TEST)
    return dict(o.removeprefix("data.").split("=", 1) for o in overrides)


def loader_args(files: dict[str, str]) -> dict[str, str]:
    return {"path": files["path"], "test_path": files["test_path"], "tokenizer": files["tokenizer"]}


def topic_ids(count: int) -> np.ndarray:
    """Row ``i``'s topic as its index among the sorted topic names, worked out here from the writer's rule."""
    names = sorted(llm_files.TOPICS)
    return np.array([names.index(llm_files.TOPICS[i % 3]) for i in range(count)], dtype=np.int64)


def test_categories_are_the_sorted_names_ids(files: dict[str, str]) -> None:
    split = jsonl_instructions(**loader_args(files), seq_len=16, category_column="topic")
    assert split.train.y.shape == (N_TRAIN, 16)  # still token labels for training
    assert split.train.categories is not None
    np.testing.assert_array_equal(split.train.categories, topic_ids(N_TRAIN))
    np.testing.assert_array_equal(split.train.labels, topic_ids(N_TRAIN))  # what the partitioners are given
    assert split.train.categories[:3].tolist() == [2, 0, 1]  # nature, animals, motion


def test_any_json_scalar_is_a_category_sorted_by_kind_then_value(tmp_path: Path, files: dict[str, str]) -> None:
    values = ["b", 2, True, 10, "a", 1.0, 1, False, "b"]
    # booleans first, then numbers by value (1 and 1.0 are one number; 10 after 2), then strings
    expected = [6, 3, 1, 4, 5, 2, 2, 0, 6]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps({"instruction": "red", "output": "cat", "c": v}) + "\n" for v in values))
    split = jsonl_instructions(
        path=str(path), tokenizer=files["tokenizer"], seq_len=8, test_fraction=0.0, category_column="c"
    )
    assert split.train.labels.tolist() == expected


@pytest.mark.parametrize("partitioner", ["dirichlet", "shards"])
def test_partition_by_category_is_the_partition_of_the_ids_as_labels(files: dict[str, str], partitioner: str) -> None:
    split = jsonl_instructions(**loader_args(files), seq_len=16, category_column="topic")
    partition = (
        functools.partial(dirichlet, num_clients=4, alpha=0.3, min_size=2)
        if partitioner == "dirichlet"
        else functools.partial(shards, num_clients=4, shards_per_client=1)
    )
    data = federate(split, partition, client_test_fraction=0.0, seed=7)
    expected = partition(topic_ids(N_TRAIN), seed=7)
    # the same examples per client (the local train/test split shuffles within each client)
    assert [sorted(c.tolist()) for c in data.client_train] == [sorted(c.tolist()) for c in expected]
    assert sorted(np.concatenate(expected).tolist()) == list(range(N_TRAIN))
    # the run's label-distribution figure counts categories per client, not tokens of the vocabulary
    ids = topic_ids(N_TRAIN)
    counts = label_counts(data)
    assert counts.shape == (4, int(max(ids)) + 1)
    assert counts.tolist() == [np.bincount(np.asarray(ids)[c], minlength=counts.shape[1]).tolist() for c in expected]


def test_classification_partitions_by_its_category_column_not_its_label(tmp_path: Path) -> None:
    overrides = dict(o.removeprefix("data.").split("=", 1) for o in llm_files.write_classification(tmp_path, 30, 3))
    rows = [json.loads(line) for line in Path(overrides["path"]).read_text().splitlines()]
    path = tmp_path / "with_users_as_categories.jsonl"
    path.write_text("".join(json.dumps({**row, "domain": row["user"]}) + "\n" for row in rows))
    split = jsonl_classification(
        path=str(path), test_path=overrides["test_path"], tokenizer=overrides["tokenizer"], category_column="domain"
    )
    assert split.train.labels.tolist() == [i % 4 for i in range(30)]  # users u0..u3, not the three label names
    assert split.train.y.tolist() == [i % 3 for i in range(30)]  # the labels: animal 0, colour 1, speed 2


def test_token_labels_without_a_category_column_are_refused_in_one_line(files: dict[str, str]) -> None:
    split = jsonl_instructions(**loader_args(files), seq_len=16)
    assert split.train.categories is None
    for partition in (functools.partial(dirichlet, num_clients=4, alpha=0.5), functools.partial(shards, num_clients=4)):
        with pytest.raises(ValueError, match=r"token labels of shape \(60, 16\); set data\.category_column") as error:
            federate(split, partition, client_test_fraction=0.0, seed=0)
        assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"instruction": "red", "output": "cat"}', "line 2 has no 'topic' field"),
        (
            '{"instruction": "red", "output": "cat", "topic": null}',
            r"line 2: data\.category_column 'topic' .*\(got null\)",
        ),
        (
            '{"instruction": "red", "output": "cat", "topic": [1]}',
            r"line 2: data\.category_column 'topic' .*\(got \[1\]\)",
        ),
        (
            '{"instruction": "red", "output": "cat", "topic": NaN}',
            r"line 2: data\.category_column 'topic' .*\(got NaN\)",
        ),
    ],
)
def test_a_bad_or_missing_category_names_the_file_and_line(
    tmp_path: Path, files: dict[str, str], line: str, message: str
) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"instruction": "red", "output": "cat", "topic": "a"}\n' + line + "\n")
    with pytest.raises(ValueError, match=rf"^data: {path} {message}$"):
        jsonl_instructions(path=str(path), tokenizer=files["tokenizer"], category_column="topic")


@pytest.mark.slow
def test_command_line_run_splits_instructions_by_dirichlet_over_topics(files: dict[str, str], tmp_path: Path) -> None:
    run = run_cli(
        [
            "model=hf_causal_lm",
            "model.hidden_size=16",
            "model.num_layers=1",
            "adapter=lora",
            "data=jsonl_instructions",
            *(f"data.{key}={value}" for key, value in files.items() if key != "user_column"),
            "data.category_column=topic",
            "partition=dirichlet",
            "partition.num_clients=4",
            "partition.alpha=0.3",
            "partition.min_size=3",
            "client_test_fraction=0.25",
            "evaluate_clients=all",
            "num_rounds=1",
            "clients_per_round=4",
            f"hydra.run.dir={tmp_path}",
        ]
    )
    assert run.returncode == 0, run.stderr
    # every client is scored on its local test part: sizes of exactly the partition dirichlet makes of the topic ids
    split = jsonl_instructions(**loader_args(files), seq_len=16, category_column="topic")
    partition = functools.partial(dirichlet, num_clients=4, alpha=0.3, min_size=3)
    expected = federate(split, partition, client_test_fraction=0.25, seed=partition_seed(0))
    with (tmp_path / "client_eval" / "round-0001.csv").open() as table:
        sizes = {int(row["client"]): int(row["num_examples"]) for row in csv.DictReader(table)}
    assert sizes == {i: len(rows) for i, rows in enumerate(expected.client_test)}
    assert len(set(sizes.values())) > 1  # skewed: not the equal sizes of an IID split
