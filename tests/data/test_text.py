"""fedsim.data.text: LEAF's character ids (checked against a per-character reference), cutting and padding, the
Sent140 tokeniser, vocabularies from word counts and from GloVe files, and word-id rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedsim.data.text import (
    LEAF_CHARACTERS,
    NUM_CHARACTER_IDS,
    UNKNOWN_CHARACTER,
    character_ids,
    encode_characters,
    encode_words,
    most_frequent_words,
    read_glove_words,
    tokenise,
)
from fedsim.models.text import read_glove

# LEAF's models/utils/language_utils.py, copied by hand
LEAF_ALL_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"


def _reference_id(c: str) -> int:
    """LEAF's letter_to_index, with its -1 for unknown characters turned into the documented id 80."""
    i = LEAF_ALL_LETTERS.find(c)
    return 80 if i < 0 else i


def test_alphabet_is_leafs() -> None:
    assert LEAF_CHARACTERS == LEAF_ALL_LETTERS and len(set(LEAF_CHARACTERS)) == 80
    assert UNKNOWN_CHARACTER == 80 and NUM_CHARACTER_IDS == 81


def test_encode_characters_matches_a_per_character_reference() -> None:
    rng = np.random.default_rng(0)
    pool = list(LEAF_CHARACTERS) + ["$", "é", "\t", "😀", "\u2014", "~"]  # some outside the alphabet, one beyond BMP
    texts = ["".join(rng.choice(pool, size=80)) for _ in range(50)]
    ids = encode_characters(texts, 80)
    assert ids.dtype == np.int64 and ids.shape == (50, 80)
    assert ids.tolist() == [[_reference_id(c) for c in t] for t in texts]
    assert (ids == 80).any() and ids.max() == 80


def test_longer_texts_keep_their_end_and_shorter_ones_are_padded_at_the_start_with_spaces() -> None:
    ids = encode_characters(["abcdef", "xy", ""], 4)
    space = LEAF_CHARACTERS.index(" ")
    expected = [[_reference_id(c) for c in "cdef"], [space, space] + [_reference_id(c) for c in "xy"], [space] * 4]
    assert ids.tolist() == expected
    assert encode_characters(["ab", "abcd"]).shape == (2, 4)  # length defaults to the longest text
    assert encode_characters([], 5).shape == (0, 5) and encode_characters(np.array(["hi"]), 2).tolist() == [[60, 61]]


def test_character_ids_and_their_errors() -> None:
    assert character_ids(["a", "\n", "}", "é", " "]).tolist() == [53, 0, 79, 80, 1]
    assert character_ids([]).shape == (0,)
    with pytest.raises(ValueError, match=r"item 1 is 'ab', not a single character"):
        character_ids(["a", "ab"])
    with pytest.raises(ValueError, match=r"item 2 is int 5"):
        encode_characters(["a", "b", 5])


def test_tokeniser_lower_cases_and_keeps_leafs_punctuation_words() -> None:
    assert tokenise("Hello, WORLD! I'm @bob_1 #Tag :) ok... a-b") == [
        "hello",
        ",",
        "world",
        "!",
        "i'm",
        "bob_1",
        "tag",
        "ok",
        ".",
        ".",
        ".",
        "a",
        "b",
    ]
    assert tokenise("  ") == []


def test_most_frequent_words_are_ranked_by_count_then_word_independently_of_order() -> None:
    texts = ["b a c", "c b", "c d", "e"]
    vocab = most_frequent_words(texts, 5)  # 3 words + padding + unknown
    assert vocab == {"c": 2, "b": 3, "a": 4}  # a, d, e tie at 1: alphabetical
    assert most_frequent_words(texts[::-1], 5) == vocab
    assert most_frequent_words(texts, None) == {"c": 2, "b": 3, "a": 4, "d": 5, "e": 6}
    with pytest.raises(ValueError, match="vocab_size must be >= 2"):
        most_frequent_words(texts, 1)


def test_encode_words_pads_at_the_end_and_maps_unknown_words_to_one() -> None:
    vocab = {"good": 2, "day": 3, "!": 4}
    ids = encode_words(["Good day !", "bad day to you all, good!", ""], vocab, 5)
    assert ids.dtype == np.int64 and ids.tolist() == [[2, 3, 4, 0, 0], [1, 3, 1, 1, 1], [0, 0, 0, 0, 0]]


def _write_glove(path: Path) -> list[tuple[str, list[float]]]:
    lines = [
        ("the", [0.1, 0.2, 0.3]),
        (",", [1.0, -1.0, 0.5]),
        ("new york", [2.0, 2.5, 3.0]),
        ("love", [-0.5, 0.25, 4.0]),
        ("the", [9.0, 9.0, 9.0]),
    ]
    path.write_text("".join(f"{w} {' '.join(map(str, v))}\n" for w, v in lines), encoding="utf-8")
    return lines


def test_glove_words_are_in_file_order_and_agree_with_the_models_vectors(tmp_path: Path) -> None:
    path = tmp_path / "glove.txt"
    lines = _write_glove(path)
    words = read_glove_words(path)
    assert words == {"the": 2, ",": 3, "new york": 4, "love": 5}  # a repeated word keeps its first line
    table = read_glove(path)  # the models' reader: the vector of id i is row i
    for word, vector in lines[:4]:
        assert torch.equal(table[words[word]], torch.tensor(vector, dtype=torch.float32))
    assert read_glove_words(path, max_words=2) == {"the": 2, ",": 3}


def test_glove_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no GloVe file .*missing\.txt; download one from https://nlp"):
        read_glove_words(tmp_path / "missing.txt")
    bad = tmp_path / "bad.txt"
    bad.write_text("a 1 2 3\nb 1\n")
    with pytest.raises(ValueError, match=r"GloVe file .*bad\.txt line 2 has 1 values after the word, line 1 has 3"):
        read_glove_words(bad)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        read_glove_words(empty)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"a 1 2 3\r\ncaf\xe9 1 2 3\r\n")
    with pytest.raises(ValueError) as error:
        read_glove_words(latin1)
    assert str(error.value).startswith(f"data: {latin1} line 2 is not UTF-8 text (byte 0xe9, the line's byte 4); ")
    latin1.write_bytes(b"a 1 2 3\r\nb 1 2 3 \r\n")  # Windows line endings: the words as with Unix ones
    assert read_glove_words(latin1) == {"a": 2, "b": 3}
