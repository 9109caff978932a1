"""``data.tokenizer=train``: a tokenizer trained on the training split only (byte-level BPE or word level), the same
``tokenizer.json`` for the same data and keys (in this interpreter and a fresh one, whatever the run seed), another
one when the training split differs, the model's vocabulary taken from it, and the one-line refusals of its keys."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from llm_files import sentence, write_instructions

from fedsim.cli.run import build_data, build_model_factory, compose
from fedsim.data.instructions import jsonl_classification, jsonl_instructions
from fedsim.data.text_corpus import held_out_text, text_corpus
from fedsim.data.tokenizer import PAD, UNK, TokenizerTraining, load_tokenizer

FRESH = """
import sys
from fedsim.data.instructions import jsonl_instructions
jsonl_instructions(path=sys.argv[1], tokenizer="train", tokenizer_kind=sys.argv[2], vocab_size=int(sys.argv[3]),
                   tokenizer_file=sys.argv[4], seq_len=8)
"""


def instructions(root: Path) -> Path:
    """40 training rows (train.jsonl; test.jsonl is ignored here: the last rows are the test split)."""
    write_instructions(root, 40, 4)
    return root / "train.jsonl"


def train(data: Path, out: Path, kind: str, vocab: int, **keys: object) -> str:
    """The ``tokenizer.json`` that ``jsonl_instructions`` trains on ``data``, as text."""
    jsonl_instructions(
        path=str(data), tokenizer="train", tokenizer_kind=kind, vocab_size=vocab, tokenizer_file=str(out), **keys
    )
    return out.read_text()


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "vocab"), [("bpe", 300), ("word", 12)])
def test_same_data_and_keys_give_the_same_tokenizer_in_a_fresh_interpreter_too(
    kind: str, vocab: int, tmp_path: Path
) -> None:
    data = instructions(tmp_path / "files")
    ours = train(data, tmp_path / "a.json", kind, vocab, seq_len=8)
    assert train(data, tmp_path / "b.json", kind, vocab, seq_len=8) == ours
    # another interpreter hashes strings with other keys and starts the trainer's threads anew
    fresh = tmp_path / "fresh.json"
    done = subprocess.run(
        [sys.executable, "-c", FRESH, str(data), kind, str(vocab), str(fresh)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert fresh.read_text() == ours
    vocabulary = load_tokenizer(str(fresh)).vocab_size
    assert vocabulary <= vocab  # word level: 9 of its 13 + 6 template words fit beside the 3 special tokens
    assert json.loads(ours)["model"]["type"] == ("BPE" if kind == "bpe" else "WordLevel")


def test_another_training_split_gives_another_tokenizer(tmp_path: Path) -> None:
    data = instructions(tmp_path / "files")
    base = train(data, tmp_path / "a.json", "word", 100, test_fraction=0.1)
    assert train(data, tmp_path / "b.json", "word", 100, test_fraction=0.5) != base
    assert train(data, tmp_path / "c.json", "bpe", 300, test_fraction=0.5) != train(
        data, tmp_path / "d.json", "bpe", 300, test_fraction=0.1
    )


def test_the_test_rows_never_reach_the_trainer(tmp_path: Path) -> None:
    rows = [{"instruction": "say red", "input": "", "output": "red cat"}] * 6 + [
        {"instruction": "say zebra", "input": "", "output": "zebra"}  # the last row: the test split
    ]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    split = jsonl_instructions(
        path=str(data), tokenizer="train", tokenizer_kind="word", tokenizer_file=str(tmp_path / "t.json"), seq_len=12
    )
    vocab = json.loads((tmp_path / "t.json").read_text())["model"]["vocab"]
    assert "zebra" not in vocab and {"red", "cat", "Response", PAD, UNK} <= vocab.keys()
    assert vocab[PAD] == 0 and vocab[UNK] == 1 and vocab["<|endoftext|>"] == 2
    assert split.train.num_classes == len(vocab) == split.test.num_classes
    assert vocab[UNK] in split.test.x[0].tolist()  # the test row's "zebra" is unknown to it


def test_a_corpus_is_held_out_by_characters_and_trained_on_the_training_text(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text("red cat runs " * 6 + "zebra")  # 83 characters
    assert held_out_text("abcdefghij", 0.3) == ("abcdefg", "hij")
    assert held_out_text("ab", 0.9) == ("a", "b")  # at least one character for training
    split = text_corpus(
        path=str(tmp_path / "c"), tokenizer="train", tokenizer_kind="word", seq_len=4, test_fraction=0.07,
        tokenizer_file=str(tmp_path / "t.json"),
    )  # fmt: skip
    tok = load_tokenizer(str(tmp_path / "t.json"))  # round(83 * 0.07) = 6: " zebra" is the test text
    assert tok.vocab_size == 3 + 3 and tok.encode("zebra") == [1]  # red, cat, runs; zebra is unknown
    assert split.test.x[0, 0] == 1 and split.test.y[0, 0] == 2  # the test text: zebra, then <eos>
    assert split.train.x[0].tolist() == tok.encode("red cat runs red")


def test_byte_level_bpe_round_trips_any_text(tmp_path: Path) -> None:
    data = instructions(tmp_path / "files")
    train(data, tmp_path / "t.json", "bpe", 300, seq_len=8)
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(tmp_path / "t.json"))
    for text in ("### Response:\nred cat", "naïve zebra ✓", sentence(3)):
        ids = raw.encode(text, add_special_tokens=False).ids
        assert raw.decode(ids) == text and UNK not in raw.encode(text).tokens


@pytest.mark.slow
def test_the_classifier_takes_its_vocabulary_from_the_trained_tokenizer(tmp_path: Path) -> None:
    rows = [{"text": sentence(i), "label": i % 2} for i in range(12)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    split = jsonl_classification(
        path=str(tmp_path / "t.jsonl"), tokenizer="train", tokenizer_kind="word", vocab_size=100, seq_len=6
    )
    words = {word for row in rows[:11] for word in row["text"].split()}  # the last row is the test split
    assert split.train.vocab_size == 3 + len(words) and split.train.num_classes == 2
    cfg = compose(
        [
            "data=jsonl_classification", f"data.path={tmp_path / 't.jsonl'}", "data.tokenizer=train",
            "data.tokenizer_kind=word", "data.seq_len=6", "model=hf_seq_cls", "model.hidden_size=8",
            "model.num_layers=1", "partition=iid", "partition.num_clients=2",
        ]
    )  # fmt: skip
    model = build_model_factory(cfg, build_data(cfg))()
    assert model.lm.config.vocab_size == 3 + len(words) and model.lm.config.num_labels == 2


def test_the_run_seed_changes_nothing_and_the_run_directory_keeps_it(tmp_path: Path) -> None:
    args = [*write_instructions(tmp_path / "files", 20, 4), "data=jsonl_instructions", "data.tokenizer=train"]
    args = [a for a in args if not a.startswith("data.tokenizer=/")]
    saved = []
    for seed in (0, 7):
        (tmp_path / f"run{seed}").mkdir()
        build_data(compose([*args, f"seed={seed}", "partition=natural"]), tmp_path / f"run{seed}")
        saved.append((tmp_path / f"run{seed}" / "tokenizer.json").read_text())
    assert saved[0] == saved[1]


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"kind": "sentencepiece"}, r"^data.tokenizer_kind must be one of bpe, word \(got 'sentencepiece'\)$"),
        (
            {"vocab_size": 258},
            r"^data.vocab_size must be an integer >= 259 \(got 258\) for data.tokenizer_kind=bpe: 256",
        ),
        ({"kind": "word", "vocab_size": 3}, r"^data.vocab_size must be an integer >= 4 \(got 3\) for data"),
    ],
)
def test_bad_training_keys_are_one_line(keys: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TokenizerTraining(**keys)  # type: ignore[arg-type]
