"""Instruction data: response-only masking (known answer), fixed length, and one-line refusals of bad rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cli_runner import run_cli

from fedsim.client.base import Client
from fedsim.data.instructions import IGNORE, encode_example, jsonl_instructions, prompt_of
from fedsim.data.tokenizer import load_tokenizer


def test_only_response_positions_are_labelled() -> None:
    # tokens 1 2 3 | 4 5 6: x is tokens but the last, label i is token i+1, prompt tokens (2, 3) are -100
    x, labels = encode_example([1, 2, 3], [4, 5, 6], seq_len=8, pad_id=0)
    assert x == [1, 2, 3, 4, 5, 0, 0, 0]
    assert labels == [IGNORE, IGNORE, 4, 5, 6, IGNORE, IGNORE, IGNORE]
    # cut at seq_len + 1 tokens: the response's tail goes first
    assert encode_example([1, 2, 3], [4, 5, 6], seq_len=4, pad_id=0) == ([1, 2, 3, 4], [IGNORE, IGNORE, 4, 5])


def test_loader_masks_each_rows_prompt(llm_files: dict[str, Path]) -> None:
    split = jsonl_instructions(path=str(llm_files["data"]), tokenizer=str(llm_files["tokenizer"]), seq_len=24)
    tok = load_tokenizer(str(llm_files["tokenizer"]))
    row = {"instruction": "say red green", "input": "", "output": "green red blue"}  # rows(48)[0] of conftest
    prompt, response = tok.encode(prompt_of(row)), tok.encode(row["output"]) + [tok.eos_id]
    assert split.train.x.shape == split.train.y.shape == (43, 24)  # 48 rows, the last 10 % (5) for the test set
    assert split.train.y[0].tolist() == [IGNORE] * (len(prompt) - 1) + response + [IGNORE] * (
        24 - len(prompt) - len(response) + 1
    )
    assert split.train.num_classes == tok.vocab_size


def test_token_loss_is_the_mean_over_scored_tokens() -> None:
    logits = torch.tensor([[[0.0, 1.0], [2.0, 0.0], [0.5, 0.5]]])  # one example, 3 positions, 2 tokens
    y = torch.tensor([[1, IGNORE, 0]])
    scored = torch.nn.functional.cross_entropy(torch.tensor([[0.0, 1.0], [0.5, 0.5]]), torch.tensor([1, 0]))
    assert torch.allclose(Client.per_example_loss(None, logits, y), scored.reshape(1))  # type: ignore[arg-type]


def test_bad_row_names_file_and_line(llm_files: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "a"}\n')
    with pytest.raises(ValueError, match=rf"^data: {bad} line 2 has no 'output' field$"):
        jsonl_instructions(path=str(bad), tokenizer=str(llm_files["tokenizer"]))
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match=rf"^data: {bad} line 1 is not JSON"):
        jsonl_instructions(path=str(bad), tokenizer=str(llm_files["tokenizer"]))


def _latin1_jsonl(path: Path) -> Path:
    """Three rows of which the third holds "café" written in Latin-1: byte 0xe9, the line's 43rd byte."""
    good = b'{"instruction": "say red", "output": "red"}\n'
    path.write_bytes(good + good + b'{"instruction": "say cafe", "output": "caf\xe9"}\n')
    return path


def test_a_file_that_is_not_utf8_names_the_file_and_the_line(llm_files: dict[str, Path], tmp_path: Path) -> None:
    bad = _latin1_jsonl(tmp_path / "latin1.jsonl")
    with pytest.raises(ValueError) as error:
        jsonl_instructions(path=str(bad), tokenizer=str(llm_files["tokenizer"]))
    assert str(error.value) == (
        f"data: {bad} line 3 is not UTF-8 text (byte 0xe9, the line's byte 43); re-encode the file as UTF-8, "
        "e.g. iconv -f latin1 -t utf-8 (if it is Latin-1)"
    )


def test_the_command_line_refuses_it_in_one_line_with_exit_status_2(llm_files: dict[str, Path], tmp_path: Path) -> None:
    bad = _latin1_jsonl(tmp_path / "latin1.jsonl")
    run = run_cli(
        [
            "data=jsonl_instructions",
            f"data.path={bad}",
            f"data.tokenizer={llm_files['tokenizer']}",
            "logger=quiet",
            f"hydra.run.dir={tmp_path / 'run'}",
        ]
    )
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"fedsim: error: data: {bad} line 3 is not UTF-8 text")
