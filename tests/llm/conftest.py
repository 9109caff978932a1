"""Files the language-model tests share: a JSON Lines instruction set and a tokenizer trained on it by the
``tokenizers`` library (nothing is downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

WORDS = [
    "red",
    "green",
    "blue",
    "cat",
    "dog",
    "bird",
    "runs",
    "jumps",
    "sleeps",
    "big",
    "small",
    "fast",
    "slow",
    "the",
    "a",
]


def rows(count: int) -> list[dict[str, str]]:
    """``count`` Alpaca rows with a user column (four users), made from :data:`WORDS` deterministically."""
    out = []
    for i in range(count):
        a, b, c = WORDS[i % 15], WORDS[(3 * i + 1) % 15], WORDS[(7 * i + 2) % 15]
        out.append(
            {"instruction": f"say {a} {b}", "input": c if i % 2 else "", "output": f"{b} {a} {c}", "user": f"u{i % 4}"}
        )
    return out


def train_tokenizer(texts: list[str], path: Path) -> Path:
    """A word-level tokenizer trained on ``texts``, saved as ``path`` (a tokenizer.json)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(special_tokens=["<pad>", "<|endoftext|>", "<unk>"])
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.save(str(path))
    return path


@pytest.fixture(scope="module")
def llm_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``data`` (48 rows, JSON Lines) and ``tokenizer`` (tokenizer.json) in a fresh folder."""
    folder = tmp_path_factory.mktemp("llm")
    data = folder / "train.jsonl"
    lines = rows(48)
    data.write_text("".join(json.dumps(r) + "\n" for r in lines))
    texts = [f"### Instruction: Input: Response: {r['instruction']} {r['input']} {r['output']}" for r in lines]
    return {"data": data, "tokenizer": train_tokenizer(texts, folder / "tokenizer.json")}
