"""Plain text as causal-LM data: next-token windows (known answer), one group per document with its own held-out
windows, LEAF Shakespeare's roles rebuilt from its sliding examples, the one-line refusals, and a command-line run
of each source."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from cli_runner import run_cli
from conftest import train_tokenizer

from fedsim.data.instructions import IGNORE
from fedsim.data.text import encode_characters
from fedsim.data.text_corpus import role_text, shakespeare_lm, text_corpus, windows

PASSAGE = "To be, or not to be, that is the question: whether tis nobler in the mind to suffer"


def test_windows_label_every_position_with_the_next_token() -> None:
    # 6 tokens -> 5 scored positions -> windows of 2: (1 2 | 2 3), (3 4 | 4 5), (5 pad | 6 -100)
    x, y = windows([1, 2, 3, 4, 5, 6], seq_len=2, pad_id=0)
    assert x.tolist() == [[1, 2], [3, 4], [5, 0]]
    assert y.tolist() == [[2, 3], [4, 5], [6, IGNORE]]
    assert windows([7], seq_len=2, pad_id=0)[0].shape == (0, 2)  # one token has no next token: no window


def write_corpus(folder: Path) -> Path:
    """Three files of a folder (one in a subfolder), the first of two paragraphs."""
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("the cat runs fast\n\nthe dog sleeps\n")
    (folder / "b.txt").write_text("a big bird jumps over the small dog " * 3)
    (folder / "sub" / "c.txt").write_text("red green blue " * 4)
    return folder


def test_each_file_is_a_group_holding_out_its_last_windows(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    split = text_corpus(path=str(corpus), seq_len=10, test_fraction=0.25)  # LEAF's characters
    texts = [(corpus / name).read_text() for name in ("a.txt", "b.txt", "sub/c.txt")]
    counts = [math.ceil((len(t) - 1) / 10) for t in texts]  # 4, 11, 6 windows
    held = [round(c * 0.25) for c in counts]  # 1, 3 (2.75), 2 (1.5 rounds to even)
    assert split.train.x.shape == (sum(counts), 10) and split.train.num_classes == 81
    mask = np.asarray(split.local_test)
    assert int(mask.sum()) == sum(held) == len(split.test)
    assert split.train.groups is not None
    owners = [i for i, (c, h) in enumerate(zip(counts, held, strict=True)) for _ in range(c - h)]
    assert split.train.groups[~mask].tolist() == owners
    ids = encode_characters([texts[1]])[0]  # file b: rows 3.. of the training part, its test windows at the end
    first = split.train.x[counts[0] - held[0]]
    assert first.tolist() == ids[:10].tolist() and split.train.y[counts[0] - held[0]].tolist() == ids[1:11].tolist()
    tail = split.test.y[held[0] + held[1] - 1].tolist()  # b's last window: its last character, then padding
    scored = (len(texts[1]) - 1) % 10 or 10
    assert tail == ids[len(ids) - scored :].tolist() + [IGNORE] * (10 - scored)


def test_paragraphs_are_documents(tmp_path: Path) -> None:
    split = text_corpus(path=str(write_corpus(tmp_path / "c")), seq_len=10, document="paragraph", test_fraction=0)
    assert split.train.groups is not None and sorted(set(split.train.groups.tolist())) == [0, 1, 2, 3]


def test_unreadable_or_empty_input_is_one_line_naming_the_file(tmp_path: Path) -> None:
    empty, binary = tmp_path / "empty.txt", tmp_path / "bad.txt"
    empty.write_text(" \n\n")
    binary.write_bytes(b"caf\xe9 au lait")
    with pytest.raises(ValueError, match=rf"^data: {empty} is empty; remove it from the corpus or give it some text$"):
        text_corpus(path=str(empty))
    with pytest.raises(
        ValueError, match=rf"^data: {binary} line 1 is not UTF-8 text \(byte 0xe9, the line's byte 4\); re-"
    ):
        text_corpus(path=str(binary))
    binary.write_bytes(b"first\nsecond\nthird caf\xe9\n")
    with pytest.raises(
        ValueError, match=rf"^data: {binary} line 3 is not UTF-8 text \(byte 0xe9, the line's byte 10\)"
    ):
        text_corpus(path=str(binary))
    with pytest.raises(FileNotFoundError, match=rf"^data.path={tmp_path / 'none'} does not exist; point it at"):
        text_corpus(path=str(tmp_path / "none"))
    (tmp_path / "folder").mkdir()
    with pytest.raises(FileNotFoundError, match=r"^data.path=\S+folder holds no .txt files"):
        text_corpus(path=str(tmp_path / "folder"))
    with pytest.raises(ValueError, match=r"^data.document must be one of file, paragraph \(got 'line'\)$"):
        text_corpus(path=str(binary), document="line")


def leaf_examples(text: str, width: int = 8) -> tuple[list[str], list[str]]:
    """LEAF's Shakespeare examples of ``text``: every ``width``-character window and the character after it."""
    return [text[i : i + width] for i in range(len(text) - width)], [text[i + width] for i in range(len(text) - width)]


def write_leaf(folder: Path) -> Path:
    """Two roles; LEAF's train/test split takes each role's first examples for training, skips a window's width
    (no overlap), tests on the rest. ROMEO's training part has a gap (two pieces)."""
    romeo, juliet = leaf_examples(PASSAGE), leaf_examples(PASSAGE[::-1])
    romeo_train = (romeo[0][:10] + romeo[0][30:40], romeo[1][:10] + romeo[1][30:40])
    parts = {
        "train": {"ROMEO": romeo_train, "JULIET": (juliet[0][:40], juliet[1][:40])},
        "test": {"ROMEO": (romeo[0][60:], romeo[1][60:]), "JULIET": (juliet[0][48:], juliet[1][48:])},
    }
    for part, users in parts.items():
        (folder / part).mkdir(parents=True)
        data = {
            "users": list(users),
            "num_samples": [len(x) for x, _ in users.values()],
            "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()},
        }
        (folder / part / f"all_data_niid_0_keep_0_{part}_9.json").write_text(json.dumps(data))
    return folder


def test_role_text_is_rebuilt_from_sliding_examples() -> None:
    xs, ys = leaf_examples(PASSAGE)
    assert role_text(xs, ys, "ROMEO") == [PASSAGE]
    assert role_text(xs[:5] + xs[9:], ys[:5] + ys[9:], "ROMEO") == [PASSAGE[:13], PASSAGE[9:]]


def test_shakespeare_lm_keeps_leafs_roles_and_split(tmp_path: Path) -> None:
    split = shakespeare_lm(root=str(tmp_path), folder=str(write_leaf(tmp_path / "leaf")), seq_len=6)
    # JULIET: 48 characters (40 windows + 8) -> 47 scored -> 8 rows; ROMEO: 2 pieces of 18 -> 3 rows each
    mask = np.asarray(split.local_test)
    assert split.train.groups is not None
    assert split.train.groups[~mask].tolist() == ["JULIET"] * 8 + ["ROMEO"] * 6
    romeo = encode_characters([PASSAGE[:18]])[0]
    assert split.train.x[8].tolist() == romeo[:6].tolist() and split.train.y[8].tolist() == romeo[1:7].tolist()
    test_text = PASSAGE[60 : len(PASSAGE)]  # ROMEO's test examples start at 60 and slide to the end
    assert split.test.groups is not None and list(split.test.groups).count("ROMEO") == math.ceil(
        (len(test_text) - 1) / 6
    )


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A corpus folder and a tokenizer.json trained on it."""
    folder = tmp_path_factory.mktemp("corpus")
    corpus = write_corpus(folder / "corpus")
    texts = [p.read_text() for p in sorted(corpus.rglob("*.txt"))]
    return {"corpus": corpus, "tokenizer": train_tokenizer(texts, folder / "tokenizer.json")}


def run_args(run_dir: Path, *extra: str) -> list[str]:
    """A 2-round run of a tiny GPT-2 on 2 natural clients a round."""
    return [
        "model=hf_causal_lm",
        "model.hidden_size=32",
        "partition=natural",
        "num_rounds=2",
        "clients_per_round=2",
        "client.optimizer.lr=0.5",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def last_round(run_dir: Path) -> dict[str, float]:
    """The last line of the run's metrics.jsonl."""
    return dict(json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1]))


@pytest.mark.slow
def test_text_corpus_from_the_command_line(corpus_files: dict[str, Path], tmp_path: Path) -> None:
    data = ["data=text_corpus", f"data.path={corpus_files['corpus']}", f"data.tokenizer={corpus_files['tokenizer']}"]
    run = run_cli(run_args(tmp_path, *data, "data.seq_len=4", "data.test_fraction=0.3", "adapter=lora"))
    assert run.returncode == 0, run.stderr
    metrics = last_round(tmp_path)
    assert metrics["eval/perplexity"] == math.exp(metrics["eval/loss"])


@pytest.mark.slow
def test_shakespeare_lm_from_the_command_line(tmp_path: Path) -> None:
    folder = write_leaf(tmp_path / "leaf")
    run = run_cli(run_args(tmp_path / "run", "data=shakespeare_lm", f"data.folder={folder}", "data.seq_len=6"))
    assert run.returncode == 0, run.stderr
    assert math.isfinite(last_round(tmp_path / "run")["eval/perplexity"])
