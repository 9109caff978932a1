"""Sequence classification: a transformers classifier gives one score per class, LoRA federates the adapters and
the new head (PEFT's modules_to_save), JSONL labels by id or by name, serial = process bitwise from the command line,
and the one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_runner import run_cli
from conftest import WORDS, train_tokenizer

from fedsim.core.checkpoint import load_checkpoint
from fedsim.core.params import ParamLayout, flatten, frozen_hash
from fedsim.data.instructions import jsonl_classification
from fedsim.data.tokenizer import load_tokenizer
from fedsim.models.hf_lm import LoRA, hf_seq_cls

SEQ_LEN, HIDDEN, CLASSES = 8, 32, 3
NAMES = ("neutral", "negative", "positive")  # sorted: negative 0, neutral 1, positive 2


def classifier(adapter: bool, vocab: int = 20) -> torch.nn.Module:
    """A tiny GPT-2 classifier, with c_attn adapters of rank 4."""
    model = hf_seq_cls(input_shape=(SEQ_LEN,), num_classes=CLASSES, vocab_size=vocab, hidden_size=HIDDEN, seed=0)
    return LoRA(r=4, alpha=8, target_modules=["c_attn"]).apply(model) if adapter else model


def test_lora_federates_the_adapters_and_the_head() -> None:
    model = classifier(adapter=True)
    names = ParamLayout.of(model).names
    assert [n for n in names if "lora_" not in n] == ["lm.base_model.model.score.modules_to_save.default.weight"]
    # 2 layers x r x (A: hidden in + B: 3 hidden out), plus the head's classes x hidden (GPT-2's head has no bias)
    assert flatten(model).numel() == 2 * 4 * (HIDDEN + 3 * HIDDEN) + CLASSES * HIDDEN
    x = torch.tensor([[3, 4, 5, 0, 0, 0, 0, 0], [3, 4, 5, 6, 7, 8, 9, 10]])
    assert model(x).shape == (2, CLASSES)  # one score per class per example
    assert frozen_hash(model) == frozen_hash(classifier(adapter=True))  # seeded: every worker builds the same


def test_right_padding_does_not_change_a_rows_scores() -> None:
    model = classifier(adapter=False).eval()
    short = torch.tensor([[3, 4, 5, 0, 0, 0, 0, 0]])
    with torch.no_grad():
        alone = model.lm(input_ids=short[:, :3]).logits  # the same tokens, no padding at all
        assert torch.allclose(model(short), alone, atol=1e-6)


def write_rows(path: Path, count: int, by_name: bool) -> Path:
    """``count`` rows whose label is which third of :data:`WORDS` the first word is from, four users."""
    lines = []
    for i in range(count):
        first, second = WORDS[i % 15], WORDS[(4 * i + 3) % 15]
        label = (i % 15) // 5
        lines.append({"text": f"{first} {second} {first}", "label": NAMES[label] if by_name else label, "user": i % 4})
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


@pytest.fixture(scope="module")
def cls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``data`` (40 rows labelled by name) and a tokenizer.json trained on :data:`WORDS`."""
    folder = tmp_path_factory.mktemp("cls")
    return {
        "data": write_rows(folder / "train.jsonl", 40, by_name=True),
        "tokenizer": train_tokenizer([" ".join(WORDS)], folder / "tokenizer.json"),
    }


def test_labels_by_name_are_sorted_class_ids(cls_files: dict[str, Path]) -> None:
    split = jsonl_classification(path=str(cls_files["data"]), tokenizer=str(cls_files["tokenizer"]), seq_len=SEQ_LEN)
    assert split.train.num_classes == CLASSES and split.train.x.shape == (36, SEQ_LEN)  # 10 % (4 rows) for the test
    assert split.train.y[:15].tolist() == [1] * 5 + [0] * 5 + [2] * 5  # neutral, negative, positive
    tok = load_tokenizer(str(cls_files["tokenizer"]))
    assert split.train.x[0].tolist() == tok.encode("red cat red") + [tok.pad_id] * 5


def test_bad_labels_are_one_line(cls_files: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "mixed.jsonl"
    bad.write_text('{"text": "red", "label": 0}\n{"text": "blue", "label": "x"}\n')
    with pytest.raises(ValueError, match=r"labels must be all class ids \(integers >= 0\) or all class names"):
        jsonl_classification(path=str(bad), tokenizer=str(cls_files["tokenizer"]))
    bad.write_text('{"text": "red", "label": 0}\n{"text": "blue"}\n')
    with pytest.raises(ValueError, match=rf"^data: {bad} line 2 has no 'label' field$"):
        jsonl_classification(path=str(bad), tokenizer=str(cls_files["tokenizer"]))
    with pytest.raises(ValueError, match=r"^model.vocab_size: set it to the tokenizer's vocabulary size"):
        hf_seq_cls(input_shape=(SEQ_LEN,), num_classes=CLASSES)
    with pytest.raises(FileNotFoundError, match=rf"^model.path={tmp_path / 'none'} is not a directory; download"):
        hf_seq_cls(input_shape=(SEQ_LEN,), num_classes=CLASSES, path=str(tmp_path / "none"))


def test_a_saved_model_loads_with_a_new_seeded_head(tmp_path: Path) -> None:
    model = classifier(adapter=False)
    model.lm.save_pretrained(tmp_path / "saved")
    loaded = hf_seq_cls(input_shape=(SEQ_LEN,), num_classes=CLASSES, path=str(tmp_path / "saved"), seed=0)
    again = hf_seq_cls(input_shape=(SEQ_LEN,), num_classes=CLASSES, path=str(tmp_path / "saved"), seed=0)
    assert torch.equal(flatten(loaded), flatten(again)) and torch.equal(flatten(loaded), flatten(model))


@pytest.mark.slow
def test_lora_classifier_serial_equals_process_bitwise(cls_files: dict[str, Path], tmp_path: Path) -> None:
    vocab = load_tokenizer(str(cls_files["tokenizer"])).vocab_size
    common = [
        "model=hf_seq_cls",
        f"model.hidden_size={HIDDEN}",
        f"model.vocab_size={vocab}",
        "adapter=lora",
        "adapter.r=4",
        "adapter.alpha=8",
        "adapter.target_modules=[c_attn]",
        "data=jsonl_classification",
        f"data.path={cls_files['data']}",
        f"data.tokenizer={cls_files['tokenizer']}",
        f"data.seq_len={SEQ_LEN}",
        "partition=dirichlet",
        "partition.num_clients=3",
        "partition.alpha=1.0",
        "partition.min_size=2",
        "num_rounds=2",
        "clients_per_round=2",
    ]
    params = {}
    for executor in ("serial", "process"):
        run = run_cli([*common, f"executor={executor}", f"hydra.run.dir={tmp_path / executor}"])
        assert run.returncode == 0, run.stderr
        params[executor] = load_checkpoint(sorted((tmp_path / executor / "checkpoints").glob("*.ckpt"))[-1])["params"]
    assert torch.equal(params["serial"], params["process"])
    layout = ParamLayout.of(classifier(adapter=True, vocab=vocab))
    assert params["serial"].numel() == layout.numel
    head = layout.mask(layout.matching(r"modules_to_save"))
    start = classifier(adapter=True, vocab=vocab)
    assert not torch.equal(params["serial"][head], flatten(start)[head])  # the head trained and was federated
    rounds = [json.loads(line) for line in (tmp_path / "serial" / "metrics.jsonl").read_text().splitlines()]
    assert 0.0 <= rounds[-1]["eval/accuracy"] <= 1.0


def test_a_file_that_is_not_utf8_names_the_file_and_the_line(cls_files: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"text": "good", "label": 0}\n\n{"text": "caf\xe9", "label": 1}\n')  # line 2 is blank
    with pytest.raises(ValueError, match=rf"^data: {bad} line 3 is not UTF-8 text \(byte 0xe9, the line's byte 14\); "):
        jsonl_classification(path=str(bad), tokenizer=str(cls_files["tokenizer"]))
