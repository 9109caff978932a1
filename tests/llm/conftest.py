"""Files the language-model tests share: a JSON Lines instruction set and a tokenizer trained on it by the
``tokenizers`` library (nothing is downloaded)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))  # tests/data: the LLM file writers

from llm_files import train_tokenizer  # noqa: E402

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


@pytest.fixture(scope="module")
def llm_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``data`` (48 rows, JSON Lines) and ``tokenizer`` (tokenizer.json) in a fresh folder."""
    folder = tmp_path_factory.mktemp("llm")
    data = folder / "train.jsonl"
    lines = rows(48)
    data.write_text("".join(json.dumps(r) + "\n" for r in lines))
    texts = [f"### Instruction: Input: Response: {r['instruction']} {r['input']} {r['output']}" for r in lines]
    return {"data": data, "tokenizer": train_tokenizer(texts, folder / "tokenizer.json")}
