"""The instruction-tuning task from the command line with no tokenizer given (``data.tokenizer=train``), offline: the
run trains one on its training rows, saves it as ``<run dir>/tokenizer.json``, and a resumed run reads that file
(never trains again) and ends bitwise equal to a run that was not interrupted. A resume whose tokenizer keys
changed, whose tokenizer file was changed, or whose tokenizer file is gone, is refused in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli

from fedsim.core.checkpoint import load_latest

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def args(files: dict[str, Path], run_dir: Path, *extra: str) -> list[str]:
    """FedIT on the 48 rows of the four users, byte-level BPE of at most 300 ids trained by the run."""
    return [
        "model=hf_causal_lm",
        "model.hidden_size=32",
        "adapter=lora",
        "adapter.r=4",
        "data=jsonl_instructions",
        f"data.path={files['data']}",
        "data.tokenizer=train",
        "data.tokenizer_kind=bpe",
        "data.vocab_size=300",
        "data.seq_len=40",
        "data.user_column=user",
        "partition=natural",
        "clients_per_round=2",
        "checkpoint_every=1",
        "logger.progress=false",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def metrics(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "system/"))} for r in records]


@pytest.fixture(scope="module")
def runs(llm_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``full``: 3 rounds; ``resumed``: 2 rounds, then resumed to 3 (``before``: its tokenizer.json's inode and
    modification time before the resume)."""
    root = tmp_path_factory.mktemp("offline")
    full, resumed = root / "full", root / "resumed"
    for run_dir, rounds in ((full, 3), (resumed, 2)):
        done = run_cli(args(llm_files, run_dir, f"num_rounds={rounds}"), env=OFFLINE)
        assert done.returncode == 0, done.stderr
    stat = (resumed / "tokenizer.json").stat()
    (root / "before").write_text(json.dumps([stat.st_ino, stat.st_mtime_ns]))
    done = run_cli(args(llm_files, resumed, "num_rounds=3", "resume=true"), env=OFFLINE)
    assert done.returncode == 0, done.stderr
    return {"full": full, "resumed": resumed, "before": root / "before"}


@pytest.mark.slow
def test_the_run_trains_its_tokenizer_and_a_resume_ends_bitwise_equal(runs: dict[str, Path]) -> None:
    full, resumed = runs["full"], runs["resumed"]
    saved = json.loads((full / "tokenizer.json").read_text())
    assert saved["model"]["type"] == "BPE" and len(saved["model"]["vocab"]) <= 300
    stat = (resumed / "tokenizer.json").stat()
    assert json.loads(runs["before"].read_text()) == [stat.st_ino, stat.st_mtime_ns]  # read, not written again
    assert (resumed / "tokenizer.json").read_text() == (full / "tokenizer.json").read_text()
    assert torch.equal(
        load_latest(resumed / "checkpoints")[1]["params"], load_latest(full / "checkpoints")[1]["params"]
    )
    assert metrics(resumed) == metrics(full) and len(metrics(full)) == 3
    assert all(math.isfinite(r["eval/perplexity"]) for r in metrics(full))  # every test row has scored tokens


@pytest.mark.slow
def test_a_resume_with_other_tokenizer_keys_or_without_its_tokenizer_is_one_line(
    runs: dict[str, Path], llm_files: dict[str, Path]
) -> None:
    resumed = runs["resumed"]
    changed = run_cli(args(llm_files, resumed, "num_rounds=4", "resume=true", "data.vocab_size=400"), env=OFFLINE)
    lines = [line for line in changed.stderr.splitlines() if line.strip()]
    assert changed.returncode != 0 and len(lines) == 1 and "data.vocab_size (300 -> 400)" in lines[0], changed.stderr
    tokenizer = resumed / "tokenizer.json"
    original = tokenizer.read_text()
    edited = json.loads(original)
    vocab = edited["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[-2:]  # two ids swapped: a tokenizer of the same size that differs
    vocab[first], vocab[second] = vocab[second], vocab[first]
    tokenizer.write_text(json.dumps(edited))
    other = run_cli(args(llm_files, resumed, "num_rounds=4", "resume=true"), env=OFFLINE)
    lines = [line for line in other.stderr.splitlines() if line.strip()]
    assert other.returncode == 2 and len(lines) == 1, other.stderr
    assert "tokenizer.json is not the tokenizer the run trained" in lines[0] and "start a new run" in lines[0]
    tokenizer.write_text(original)
    tokenizer.rename(resumed / "moved.json")
    gone = run_cli(args(llm_files, resumed, "num_rounds=4", "resume=true"), env=OFFLINE)
    lines = [line for line in gone.stderr.splitlines() if line.strip()]
    assert gone.returncode == 2 and len(lines) == 1, gone.stderr
    assert f"{resumed / 'tokenizer.json'}, the tokenizer the run trained, is missing" in lines[0]
    assert len(metrics(resumed)) == 3  # nothing ran
