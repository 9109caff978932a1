"""Synthetic text: heterogeneous clients writing over a small vocabulary, each from its own Markov chain
(``data=synthetic_text``), so that a language-model run needs no file at all.

This generator is fedsim's own (it is not the data of a paper). Over a vocabulary of ``V = vocab_size`` token ids
``0 .. V-1``, client ``k``'s text is a first-order Markov chain with the transition matrix::

    P_k = (1 - α) · S + α · C_k          (row i: the distribution of the token after token i)

where ``S`` (shared by every client) and ``C_k`` (client ``k``'s own) have rows drawn from a symmetric
``Dirichlet(concentration)``: a small ``concentration`` makes each row peaked on a few next tokens (text a model can
learn), a large one makes it nearly uniform. ``α`` sets the heterogeneity: ``α = 0`` gives every client the same
chain (IID text), ``α = 1`` chains with nothing in common. Each client writes ``tokens_per_client`` tokens: the first
uniform over the vocabulary, every next one drawn from the current token's row of ``P_k`` (by inverse transform of a
uniform draw, :func:`sample_chain`).

Randomness: ``S`` comes from ``numpy.random.default_rng([seed, 0])``, client ``k``'s ``C_k``, first token and
uniforms from ``default_rng([seed, k + 1])`` (in that order), so a client's text depends on the seed, α, the
vocabulary and its own id only: adding clients changes no other client.

Each client's tokens are cut into next-token windows of ``seq_len`` positions exactly as a document of
:mod:`fedsim.data.text_corpus` is (:func:`fedsim.data.text_corpus.windows`: labels ``[N, seq_len]``, -100 on the
padding of the last window, whose inputs are token 0), and its last ``test_fraction`` of windows (rounded, at least one
left for training) are its own test windows (the ``local_test`` layout of
:class:`~fedsim.data.tensor_data.DataSplit`): the rows' groups are the clients, so ``partition=natural`` makes one
client per chain, and the centralized test set is every client's test windows. ``num_classes`` is ``vocab_size``.
"""

from __future__ import annotations

import numpy as np

from fedsim.core.checks import integer, number, within
from fedsim.data.reading import refuse_beyond_memory
from fedsim.data.tensor_data import DataSplit
from fedsim.data.text_corpus import held_out, pooled_windows, windows

PAD = 0
"""The input id on the padding of a client's last window (its labels there are -100, so no loss sees it)."""


def mix(shared: np.ndarray, own: np.ndarray, alpha: float) -> np.ndarray:
    """The client's transition matrix ``(1 - alpha) * shared + alpha * own`` (both row-stochastic ``[V, V]``)."""
    return (1.0 - alpha) * shared + alpha * own


def sample_chain(transition: np.ndarray, first: int, uniforms: np.ndarray) -> np.ndarray:
    """The chain that starts at token ``first`` and takes one step per entry of ``uniforms`` (each in ``[0, 1)``):
    from token ``i`` with uniform ``u`` it moves to the smallest ``j`` with ``u < transition[i, 0] + ... +
    transition[i, j]`` (the inverse of the row's cumulative distribution; the last token if rounding leaves the row's
    sum below ``u``). Returns ``len(uniforms) + 1`` token ids."""
    cumulative = np.cumsum(transition, axis=1)
    last = transition.shape[1] - 1
    tokens = np.empty(len(uniforms) + 1, dtype=np.int64)
    tokens[0] = first
    for step, u in enumerate(uniforms.tolist()):
        tokens[step + 1] = min(int(np.searchsorted(cumulative[tokens[step]], u, side="right")), last)
    return tokens


def client_tokens(
    shared: np.ndarray, k: int, *, alpha: float, concentration: float, length: int, seed: int
) -> np.ndarray:
    """Client ``k``'s ``length`` tokens (see the module's docstring for the stream they come from)."""
    vocab = shared.shape[0]
    rng = np.random.default_rng([seed, k + 1])
    own = rng.dirichlet(np.full(vocab, concentration), size=vocab)
    first = int(rng.integers(vocab))
    return sample_chain(mix(shared, own, alpha), first, rng.random(length - 1))


def _check(alpha: float, num_clients: int, vocab_size: int, tokens_per_client: int, seq_len: int) -> None:
    """One line naming the first bad ``data.*`` key."""
    within("data.alpha", alpha, "[0, 1]", hint=": 0 is one shared chain, 1 every client its own")
    for key, value, lowest in (
        ("num_clients", num_clients, 1),
        ("vocab_size", vocab_size, 2),
        ("tokens_per_client", tokens_per_client, 2),
        ("seq_len", seq_len, 1),
    ):
        integer(f"data.{key}", value, lowest)


def memory_estimate(
    *, num_clients: int = 20, vocab_size: int = 16, tokens_per_client: int = 400, seq_len: int = 16
) -> int:
    """The bytes that :func:`synthetic_text` and the federation built on its windows take at their peak, from the
    settings alone. With ``K`` clients of ``L`` tokens, ``S = seq_len``, ``V = vocab_size`` and ``R = K·⌈(L − 1) / S⌉``
    windows::

        max(32·R·S + 9·R,       generating: every client's windows (x and labels, int64) and, while they are stacked
                                into one tensor, their copy; the group ids (int64) and the test mask (bool)
            16·R·S + 73·R)      federating: the windows, and the partition's int64 indices while they are sorted
        + 32·V²                 the shared transition matrix and three of one client's (its own, the mixture
                                being formed, the cumulative one)
        + 80·L + 2 KiB·K        one client's uniforms, tokens and their Python list; each client's arrays' headers
    """
    rows = num_clients * -(-(tokens_per_client - 1) // seq_len)
    windows = max(32 * rows * seq_len + 9 * rows, 16 * rows * seq_len + 73 * rows)
    return windows + 32 * vocab_size**2 + 80 * tokens_per_client + 2048 * num_clients


def _check_memory(num_clients: int, vocab_size: int, tokens_per_client: int, seq_len: int) -> None:
    """Refuse, before anything is drawn, text whose :func:`memory_estimate` exceeds the memory available; the key
    named is ``vocab_size`` when the transition matrices take most of it, else ``num_clients``."""
    need = memory_estimate(
        num_clients=num_clients, vocab_size=vocab_size, tokens_per_client=tokens_per_client, seq_len=seq_len
    )
    if 32 * vocab_size**2 > need / 2:
        setting, what = f"data.vocab_size={vocab_size}", f"the transition matrices of {vocab_size:,} tokens"
    else:
        setting, what = f"data.num_clients={num_clients}", f"{num_clients:,} clients of {tokens_per_client:,} tokens"
    remedy = "lower data.num_clients, data.tokens_per_client or data.vocab_size"
    refuse_beyond_memory(setting, need, what, remedy)


def synthetic_text(
    *,
    alpha: float = 0.5,
    num_clients: int = 20,
    vocab_size: int = 16,
    tokens_per_client: int = 400,
    seq_len: int = 16,
    concentration: float = 0.2,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> DataSplit:
    """``num_clients`` clients' Markov-chain text as next-token windows, grouped by client, each client holding out
    its last ``test_fraction`` of windows; see the module's docstring. Deterministic in ``seed``."""
    _check(alpha, num_clients, vocab_size, tokens_per_client, seq_len)
    number("data.concentration", concentration, above=0)
    within("data.test_fraction", test_fraction, "[0, 1)")
    _check_memory(num_clients, vocab_size, tokens_per_client, seq_len)
    shared = np.random.default_rng([seed, 0]).dirichlet(np.full(vocab_size, concentration), size=vocab_size)

    def text(k: int) -> list[int]:
        return client_tokens(
            shared, k, alpha=alpha, concentration=concentration, length=tokens_per_client, seed=seed
        ).tolist()

    pieces = [windows(text(k), seq_len, PAD) for k in range(num_clients)]
    train, test = zip(*(held_out(p, test_fraction) for p in pieces), strict=True)
    return pooled_windows(range(num_clients), list(train), list(test), vocab_size, seq_len)
