"""data=synthetic_text: the Markov-chain step and the mixing by hand, the window layout of text_corpus, the streams
the docstring names (checked against the chain's empirical transitions), determinism, and the one-line refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsim.data.instructions import IGNORE
from fedsim.data.synthetic_text import client_tokens, memory_estimate, mix, sample_chain, synthetic_text
from fedsim.data.text_corpus import windows


def test_mix_weights_the_shared_and_the_own_chain() -> None:
    shared = np.array([[1.0, 0.0], [0.0, 1.0]])
    own = np.array([[0.0, 1.0], [1.0, 0.0]])
    # (1 - 0.25) * shared + 0.25 * own: 0.75 stays, 0.25 switches
    assert mix(shared, own, 0.25).tolist() == [[0.75, 0.25], [0.25, 0.75]]
    assert mix(shared, own, 0.0).tolist() == shared.tolist() and mix(shared, own, 1.0).tolist() == own.tolist()


def test_sample_chain_inverts_each_rows_cumulative_distribution() -> None:
    transition = np.array([[0.5, 0.5], [0.125, 0.875]])  # cumulative rows: [0.5, 1], [0.125, 1] (exact in binary)
    uniforms = np.array([0.7, 0.0625, 0.5, 0.125, 0.99])
    # from 0: 0.7 >= 0.5 -> 1;  from 1: 0.0625 < 0.125 -> 0;  from 0: 0.5 is not < 0.5 -> 1;
    # from 1: 0.125 is not < 0.125 -> 1;  from 1: 0.99 < 1 -> 1
    assert sample_chain(transition, 0, uniforms).tolist() == [0, 1, 0, 1, 1, 1]
    short = np.array([[0.25, 0.25], [0.5, 0.5]])  # a row summing below u (rounding) ends on the last token
    assert sample_chain(short, 0, np.array([0.75])).tolist() == [0, 1]


def test_layout_is_text_corpus_windows_per_client_with_its_last_windows_held_out() -> None:
    split = synthetic_text(num_clients=2, vocab_size=5, tokens_per_client=7, seq_len=3, test_fraction=0.4, seed=3)
    # 7 tokens: 6 scored positions -> 2 windows of 3 a client; round(2 * 0.4) = 1 held out each
    shared = np.random.default_rng([3, 0]).dirichlet(np.full(5, 0.2), size=5)
    pieces = [windows(client_tokens(shared, k, alpha=0.5, concentration=0.2, length=7, seed=3), 3, 0) for k in (0, 1)]
    x = np.concatenate([pieces[0][0][:1], pieces[1][0][:1], pieces[0][0][1:], pieces[1][0][1:]])
    y = np.concatenate([pieces[0][1][:1], pieces[1][1][:1], pieces[0][1][1:], pieces[1][1][1:]])
    assert split.train.x.tolist() == x.tolist() and split.train.y.tolist() == y.tolist()
    assert split.train.groups is not None and split.train.groups.tolist() == [0, 1, 0, 1]
    assert np.asarray(split.local_test).tolist() == [False, False, True, True]
    assert torch.equal(split.test.x, split.train.x[2:]) and split.train.num_classes == split.test.num_classes == 5
    assert x[:, 1:].tolist() == y[:, :-1].tolist()  # every label is the next position's input


def test_padding_of_the_last_window_is_ignored() -> None:
    split = synthetic_text(num_clients=1, vocab_size=4, tokens_per_client=6, seq_len=4, test_fraction=0.0)
    # 5 scored positions: one full window, then one scored position and 3 of padding
    assert split.train.y.shape == (2, 4) and split.train.y[1, 1:].tolist() == [IGNORE] * 3
    assert split.train.x[1, 1:].tolist() == [0, 0, 0]


def test_streams_are_those_the_docstring_names() -> None:
    """Client 1's empirical transitions over a long text match (1 - α)·S + α·C_1 drawn from the named streams, each
    within 5 binomial standard deviations (a chance of failure below 1e-4 over the 16 entries)."""
    alpha, vocab, length, seed = 0.3, 4, 40_001, 7
    split = synthetic_text(alpha=alpha, num_clients=2, vocab_size=vocab, tokens_per_client=length, seq_len=100,
                           concentration=1.0, test_fraction=0.0, seed=seed)  # fmt: skip
    shared = np.random.default_rng([seed, 0]).dirichlet(np.ones(vocab), size=vocab)
    own = np.random.default_rng([seed, 2]).dirichlet(np.ones(vocab), size=vocab)
    expected = mix(shared, own, alpha)
    assert split.train.groups is not None
    x, y = split.train.x[split.train.groups == 1].reshape(-1), split.train.y[split.train.groups == 1].reshape(-1)
    scored = y != IGNORE
    counts = np.zeros((vocab, vocab))
    np.add.at(counts, (x[scored].numpy(), y[scored].numpy()), 1)
    visits = counts.sum(axis=1, keepdims=True)
    bound = 5 * np.sqrt(expected * (1 - expected) / visits)
    assert counts.sum() == length - 1 and bool(np.all(np.abs(counts / visits - expected) <= bound + 1e-12))


def test_deterministic_in_the_seed_and_a_clients_text_ignores_the_others() -> None:
    a, b = synthetic_text(seed=1), synthetic_text(seed=1)
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.train.y, b.train.y)
    assert not torch.equal(a.train.x, synthetic_text(seed=2).train.x)
    few = synthetic_text(seed=1, num_clients=3, test_fraction=0.0)
    many = synthetic_text(seed=1, num_clients=5, test_fraction=0.0)
    assert few.train.groups is not None and many.train.groups is not None
    assert torch.equal(few.train.x, many.train.x[np.isin(many.train.groups, [0, 1, 2])])


def test_alpha_zero_is_one_chain_for_every_client() -> None:
    shared = np.random.default_rng([0, 0]).dirichlet(np.full(6, 0.2), size=6)
    # with α = 0, client 4 follows S with its own first token and uniforms
    rng = np.random.default_rng([0, 5])
    rng.dirichlet(np.full(6, 0.2), size=6)
    first = int(rng.integers(6))
    expected = sample_chain(shared, first, rng.random(49))
    got = client_tokens(shared, 4, alpha=0.0, concentration=0.2, length=50, seed=0)
    assert got.tolist() == expected.tolist()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"alpha": 1.5},
            r"^data.alpha must be in \[0, 1\] \(got 1.5\): 0 is one shared chain, 1 every client its own$",
        ),
        ({"num_clients": 0}, r"^data.num_clients must be an integer >= 1 \(got 0\)$"),
        ({"vocab_size": 1}, r"^data.vocab_size must be an integer >= 2 \(got 1\)$"),
        ({"tokens_per_client": 1}, r"^data.tokens_per_client must be an integer >= 2 \(got 1\)$"),
        ({"seq_len": 0}, r"^data.seq_len must be an integer >= 1 \(got 0\)$"),
        ({"concentration": 0.0}, r"^data.concentration must be a finite number > 0 \(got 0.0\)$"),
        ({"test_fraction": 1.0}, r"^data.test_fraction must be in \[0, 1\) \(got 1.0\)$"),
    ],
)
def test_bad_settings_are_one_line_naming_the_key(overrides: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        synthetic_text(**overrides)


def test_the_memory_estimate_is_its_documented_formula() -> None:
    # 20 clients of 400 tokens in windows of 16: R = 20·⌈399/16⌉ = 500 windows. Generating 32·500·16 + 9·500 =
    # 260,500 beats federating 16·500·16 + 73·500 = 164,500; 32·16² = 8,192; 80·400 = 32,000; 2048·20 = 40,960.
    assert memory_estimate() == 260_500 + 8_192 + 32_000 + 40_960
    # windows of 2 tokens: federating 16·R·2 + 73·R beats 32·R·2 + 9·R (R = 20·⌈399/2⌉ = 4,000)
    assert memory_estimate(seq_len=2) == 16 * 4000 * 2 + 73 * 4000 + 8_192 + 32_000 + 40_960


@pytest.mark.parametrize(
    ("overrides", "start"),
    [({"num_clients": 10**9}, "data.num_clients=1000000000: "), ({"vocab_size": 10**7}, "data.vocab_size=10000000: ")],
)
def test_text_beyond_any_memory_is_refused_in_one_line_naming_the_key(overrides: dict, start: str) -> None:
    # 10^9 clients: 32·R·16 with R = 2.5·10^10 windows, 13.7 TiB; 10^7 tokens: 32·10^14 bytes of matrices, 2.8 PiB
    with pytest.raises(ValueError) as error:
        synthetic_text(**overrides)
    assert str(error.value).startswith(start) and "of memory" in str(error.value) and "\n" not in str(error.value)
