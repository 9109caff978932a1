"""Tiny files of the language-model data options (fedsim.data.instructions, fedsim.data.text_corpus), written the way
a user's own files are: JSON Lines rows, plain ``.txt`` documents, and a word-level tokenizer trained on them by the
``tokenizers`` library (nothing is downloaded). Each writer returns the overrides that point its option at them."""

from __future__ import annotations

import json
from pathlib import Path

TOPICS = ("nature", "animals", "motion")
"""The ``topic`` of instruction row ``i`` is ``TOPICS[i % 3]`` (sorted: animals 0, motion 1, nature 2)."""

WORDS = ("red", "green", "blue", "cat", "dog", "bird", "runs", "jumps", "sleeps", "big", "small", "fast", "slow")


def sentence(i: int, length: int = 4) -> str:
    """A deterministic sentence of ``length`` words, the ``i``-th."""
    return " ".join(WORDS[(i * 7 + 3 * k) % len(WORDS)] for k in range(length))


def train_tokenizer(texts: list[str], path: Path) -> Path:
    """A word-level tokenizer of ``texts`` (with ``<pad>`` id 0, ``<|endoftext|>`` and ``<unk>``), saved as ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(special_tokens=["<pad>", "<|endoftext|>", "<unk>"])
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.save(str(path))
    return path


def _jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _tokenizer(root: Path) -> Path:
    """A tokenizer of every word the writers use, and the words of the Alpaca template."""
    return train_tokenizer([" ".join(WORDS), "### Instruction: Input: Response:"], root / "tokenizer.json")


def write_instructions(root: Path, n_train: int, n_test: int) -> list[str]:
    """Alpaca rows (``instruction``, ``input``, ``output``, ``user`` of 4 users, ``topic`` of :data:`TOPICS`):
    ``n_train`` in train.jsonl, ``n_test`` in test.jsonl."""
    root.mkdir(parents=True, exist_ok=True)

    def rows(count: int, start: int) -> list[dict[str, object]]:
        return [
            {
                "instruction": sentence(i, 2),
                "input": sentence(i + 1, 1),
                "output": sentence(i, 3),
                "user": f"u{i % 4}",
                "topic": TOPICS[i % 3],
            }
            for i in range(start, start + count)
        ]

    return [
        f"data.path={_jsonl(root / 'train.jsonl', rows(n_train, 0))}",
        f"data.test_path={_jsonl(root / 'test.jsonl', rows(n_test, n_train))}",
        f"data.tokenizer={_tokenizer(root)}",
        "data.seq_len=16",
        "data.user_column=user",
    ]


def write_classification(root: Path, n_train: int, n_test: int) -> list[str]:
    """``text`` and ``label`` rows (three class names, ``user`` of 4 users): ``n_train`` and ``n_test`` rows."""
    root.mkdir(parents=True, exist_ok=True)

    def rows(count: int, start: int) -> list[dict[str, object]]:
        names = ("animal", "colour", "speed")
        return [{"text": sentence(i), "label": names[i % 3], "user": f"u{i % 4}"} for i in range(start, start + count)]

    return [
        f"data.path={_jsonl(root / 'train.jsonl', rows(n_train, 0))}",
        f"data.test_path={_jsonl(root / 'test.jsonl', rows(n_test, n_train))}",
        f"data.tokenizer={_tokenizer(root)}",
        "data.seq_len=8",
        "data.user_column=user",
    ]


def write_corpus(root: Path, documents: int = 4, sentences: int = 12) -> list[str]:
    """A folder of ``documents`` ``.txt`` files of ``sentences`` lines each (one client per file under
    ``partition=natural``)."""
    folder = root / "corpus"
    folder.mkdir(parents=True, exist_ok=True)
    for d in range(documents):
        (folder / f"doc{d}.txt").write_text("\n".join(sentence(d * sentences + s) for s in range(sentences)) + "\n")
    return [f"data.path={folder}", f"data.tokenizer={_tokenizer(root)}", "data.seq_len=8", "data.test_fraction=0.25"]
