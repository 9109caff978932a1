"""Text models: shapes, architecture sizes, padding invariance, GloVe files, refused inputs and the option files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate

from fedsim.cli.run import compose, run_config
from fedsim.core.params import flatten
from fedsim.models.text import BagOfWords, CharLSTM, SentimentLSTM, last_token_index, read_glove


def padded_rows(vocab: int, lengths: list[int], width: int = 25, seed: int = 0) -> torch.Tensor:
    """Word ids 2..vocab-1, each row followed by 0-padding up to ``width``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(2, vocab, (len(lengths), width), generator=g)
    for row, n in enumerate(lengths):
        x[row, n:] = 0
    return x


def write_glove(path: Path, words: list[str], dim: int, seed: int = 0) -> np.ndarray:
    """A GloVe text file ("word v1 ... vd" per line); returns the vectors as written (5 decimals)."""
    vectors = np.round(np.random.default_rng(seed).normal(size=(len(words), dim)), 5).astype(np.float32)
    lines = (w + " " + " ".join(f"{v:.5f}" for v in row) + "\n" for w, row in zip(words, vectors, strict=True))
    path.write_text("".join(lines), encoding="utf-8")
    return vectors


# --- shapes and architecture --------------------------------------------------------------------------------


def test_char_lstm_is_mcmahans_shakespeare_model() -> None:
    """8-dim embedding, 2 × LSTM(256), dense over the 80 characters: PyTorch's LSTM has two bias vectors per layer."""
    torch.manual_seed(0)
    model = CharLSTM((80,), 80)
    logits = model(torch.randint(0, 80, (3, 80)))
    assert logits.shape == (3, 80) and logits.dtype == torch.float32
    h, v = 256, 80
    lstm = 4 * h * (8 + h) + 8 * h + 4 * h * (2 * h) + 8 * h
    assert sum(p.numel() for p in model.parameters()) == v * 8 + lstm + h * v + v == 819_920
    assert model.embedding.num_embeddings == 80 and CharLSTM((80,), 81).embedding.num_embeddings == 81
    assert CharLSTM((80,), 80, vocab_size=90).embedding.num_embeddings == 90


def test_char_lstm_reads_the_last_position() -> None:
    torch.manual_seed(0)
    model = CharLSTM((10,), 12, hidden=16)
    x = torch.randint(0, 12, (2, 10))
    changed = x.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 12
    assert not torch.equal(model(x), model(changed)), "the character just before the target must matter"


@pytest.mark.parametrize("cls", [SentimentLSTM, BagOfWords])
def test_sent140_models_output_two_logits(cls: type) -> None:
    torch.manual_seed(0)
    model = cls((25,), 2, vocab_size=50)
    assert model(padded_rows(50, [25, 3, 0, 12])).shape == (4, 2)


def test_sentiment_lstm_is_leafs_architecture() -> None:
    model = SentimentLSTM((25,), 2, vocab_size=10_002)
    assert (model.embedding.dim, model.lstm.hidden_size, model.lstm.num_layers) == (100, 100, 2)
    assert (model.fc1.out_features, model.fc2.out_features) == (128, 2)


def test_last_token_index() -> None:
    x = torch.tensor([[5, 6, 7, 0, 0], [5, 0, 0, 0, 0], [0, 0, 0, 0, 0], [4, 4, 4, 4, 4], [3, 0, 9, 0, 0]])
    assert last_token_index(x).tolist() == [2, 0, 0, 4, 2]


# --- padding ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [SentimentLSTM, BagOfWords])
def test_padding_does_not_change_the_logits(cls: type) -> None:
    """More padding at the end of the rows, or none beyond the longest row, gives the same logits bit for bit;
    changing a real word does change them."""
    torch.manual_seed(0)
    model = cls((25,), 2, vocab_size=50, embed_dim=16)
    x = padded_rows(50, [25, 3, 10, 1, 7])
    logits = model(x)
    assert torch.equal(model(torch.cat([x, torch.zeros(5, 9, dtype=torch.int64)], dim=1)), logits)
    short = x[1:]  # rows of at most 10 words: cutting the padding after them changes nothing either
    assert torch.equal(model(short[:, :10]), model(short))
    changed = x.clone()
    changed[1, 2] = 2 if x[1, 2] != 2 else 3
    assert not torch.equal(model(changed)[1], logits[1])


@pytest.mark.parametrize("cls", [SentimentLSTM, BagOfWords])
def test_a_row_of_padding_only_gives_finite_logits(cls: type) -> None:
    model = cls((25,), 2, vocab_size=50)
    assert torch.isfinite(model(torch.zeros(2, 25, dtype=torch.int64))).all()


def test_bag_of_words_is_the_mean_of_the_words() -> None:
    torch.manual_seed(0)
    model = BagOfWords((6,), 3, vocab_size=20, embed_dim=4)
    x = torch.tensor([[4, 9, 9, 0, 0, 0]])
    mean = model.embedding.weight[[4, 9, 9]].mean(dim=0)
    torch.testing.assert_close(model(x)[0], model.fc(mean))


# --- GloVe --------------------------------------------------------------------------------------------------


def test_glove_rows_follow_the_file_lines(tmp_path: Path) -> None:
    vectors = write_glove(tmp_path / "glove.txt", ["the", "a", "movie", "good"], dim=5)
    table = read_glove(tmp_path / "glove.txt")
    assert table.shape == (6, 5) and table.dtype == torch.float32
    assert torch.equal(table[:2], torch.zeros(2, 5)), "padding and unknown words are zero vectors"
    assert torch.equal(table[2:], torch.from_numpy(vectors))
    assert torch.equal(read_glove(tmp_path / "glove.txt", max_words=2), table[:4])


def test_glove_word_with_spaces_takes_the_last_values(tmp_path: Path) -> None:
    (tmp_path / "g.txt").write_text("x 1 2\nat name@x.com 3 4\ny 5 6\n", encoding="utf-8")
    assert read_glove(tmp_path / "g.txt")[2:].tolist() == [[1, 2], [3, 4], [5, 6]]


@pytest.mark.parametrize("cls", [SentimentLSTM, BagOfWords])
def test_frozen_glove_is_used_fixed_and_kept_out_of_the_weights(cls: type, tmp_path: Path) -> None:
    vectors = write_glove(tmp_path / "glove.txt", [f"w{i}" for i in range(8)], dim=6)
    model = cls((25,), 2, glove=str(tmp_path / "glove.txt"))
    assert model.embedding.dim == 6 and torch.equal(model.embedding.table[2:], torch.from_numpy(vectors))
    assert not any(name.startswith("embedding") for name in model.state_dict()), "frozen vectors are not federated"
    x = padded_rows(10, [5, 25, 2])
    torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 1])).backward()
    assert all(p.grad is not None for p in model.parameters())
    assert cls((25,), 2, glove=str(tmp_path / "glove.txt"), vocab_size=10).embedding.table.shape == (10, 6)


def test_fine_tuned_glove_is_a_federated_parameter(tmp_path: Path) -> None:
    vectors = write_glove(tmp_path / "glove.txt", [f"w{i}" for i in range(8)], dim=6)
    model = BagOfWords((25,), 2, glove=str(tmp_path / "glove.txt"), freeze_embedding=False)
    assert torch.equal(model.state_dict()["embedding.weight"][2:], torch.from_numpy(vectors))
    assert flatten(model).numel() == 10 * 6 + 6 * 2 + 2
    x = padded_rows(10, [5, 25, 2])
    torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 1])).backward()
    grad = model.embedding.weight.grad
    assert grad is not None and grad[2:].abs().sum() > 0
    assert torch.equal(grad[0], torch.zeros(6)), "padding gets no gradient"


def test_vocab_size_reads_that_many_glove_words_and_refuses_more_than_the_file_has(tmp_path: Path) -> None:
    write_glove(tmp_path / "glove.txt", [f"w{i}" for i in range(8)], dim=3)
    assert SentimentLSTM((25,), 2, glove=str(tmp_path / "glove.txt"), vocab_size=6).embedding.table.shape == (6, 3)
    with pytest.raises(
        ValueError,
        match=r"model=sent_lstm: GloVe file .*glove.txt has 8 words but vocab_size is 20 .*"
        r"set model.vocab_size=10 \(or null\)",
    ):
        SentimentLSTM((25,), 2, glove=str(tmp_path / "glove.txt"), vocab_size=20)


def test_missing_glove_file_names_the_source(tmp_path: Path) -> None:
    source = r"download one from https://nlp.stanford.edu/projects/glove/"
    with pytest.raises(FileNotFoundError, match=rf"no GloVe file .*nope.txt; {source}"):
        BagOfWords((25,), 2, glove=str(tmp_path / "nope.txt"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a 1 2 3\nb 1 2\n", r"g.txt line 2 has 2 values after the word, line 1 has 3"),
        ("a 1 2\nb 1 x\n", r"g.txt line 2 has a value that is not a number"),
        ("", r"g.txt has no vectors"),
    ],
    ids=["short_line", "not_a_number", "empty"],
)
def test_malformed_glove_file_is_refused_in_one_line(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "g.txt").write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message) as info:
        read_glove(tmp_path / "g.txt")
    assert "\n" not in str(info.value)


# --- refused inputs -----------------------------------------------------------------------------------------


TEXT_MODELS = [(CharLSTM, "char_lstm"), (SentimentLSTM, "sent_lstm"), (BagOfWords, "bag_of_words")]


@pytest.mark.parametrize(("cls", "name"), TEXT_MODELS)
def test_image_shapes_are_refused(cls: type, name: str) -> None:
    kwargs = {} if cls is CharLSTM else {"vocab_size": 50}
    expected = rf"model={name} needs rows of token ids, input_shape \(L,\), but the data gives \(1, 28, 28\)"
    with pytest.raises(ValueError, match=expected):
        cls((1, 28, 28), 10, **kwargs)


@pytest.mark.parametrize("cls", [CharLSTM, SentimentLSTM, BagOfWords])
def test_float_features_are_refused(cls: type) -> None:
    model = cls((10,), 2, **({} if cls is CharLSTM else {"vocab_size": 50}))
    with pytest.raises(ValueError, match=r"reads int64 token ids but got torch.float32 features"):
        model(torch.rand(2, 10))


def test_learned_embedding_needs_a_vocabulary() -> None:
    with pytest.raises(ValueError, match=r"model=bag_of_words: vocab_size must be > 2 .* got None"):
        BagOfWords((25,), 2)


# --- option files -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("cls", "option"), TEXT_MODELS)
def test_option_files_build_the_models(cls: type, option: str) -> None:
    cfg = compose([f"model={option}"])
    model = instantiate(cfg.model)(input_shape=(25,), num_classes=2)
    assert type(model) is cls
    if cls is not CharLSTM:
        assert cfg.model.vocab_size == 10_002 and cfg.model.glove is None and cfg.model.freeze_embedding is True


def test_char_lstm_runs_from_the_command_line_on_token_arrays(tmp_path: Path) -> None:
    """An .npz of integer windows (kept as int64 ids) with per-user rows, through Hydra: model=char_lstm."""
    rng = np.random.default_rng(0)
    owners = np.repeat(np.arange(3), [12, 9, 15])
    np.savez(
        tmp_path / "chars.npz",
        x_train=rng.integers(0, 10, (36, 8)),
        y_train=rng.integers(0, 10, 36),
        x_test=rng.integers(0, 10, (6, 8)),
        y_test=rng.integers(0, 10, 6),
        client_ids=owners,
        test_client_ids=np.repeat(np.arange(3), 2),
    )
    overrides = [
        "data=npz",
        f"data.path={tmp_path / 'chars.npz'}",
        "data.num_classes=10",
        "partition=natural",
        "model=char_lstm",
        "model.hidden=8",
        "num_rounds=1",
        "clients_per_round=3",
        "logger=quiet",
    ]
    result = run_config(compose(overrides), tmp_path / "run")
    assert torch.isfinite(result.params).all() and (tmp_path / "run" / "summary.json").exists()
