"""Tests for fedsim.data.partition: coverage, determinism, skew and validation of every partitioner."""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsim.data import partition as P
from fedsim.data.local_split import split_train_test


def balanced_labels(n: int, num_classes: int = 10, seed: int = 0) -> np.ndarray:
    """``n`` labels, ``n / num_classes`` of each class, in random order."""
    return np.random.default_rng(seed).permutation(np.arange(n) % num_classes)


def assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    """Every index 0..n-1 appears in exactly one part, and all parts are int64 arrays."""
    assert all(isinstance(p, np.ndarray) and p.dtype == np.int64 and p.ndim == 1 for p in parts)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    assert np.array_equal(np.sort(flat), np.arange(n))


def entropy(counts: np.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def mean_label_entropy(parts: list[np.ndarray], labels: np.ndarray) -> float:
    k = labels.max() + 1
    return float(np.mean([entropy(np.bincount(labels[p], minlength=k)) for p in parts]))


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


# Every partitioner with its parameters bound, called the common way: fn(labels, seed=, groups=).
def bound_partitioners(num_clients: int) -> dict[str, functools.partial]:
    return {
        "iid": functools.partial(P.iid, num_clients=num_clients),
        "dirichlet": functools.partial(P.dirichlet, num_clients=num_clients, alpha=0.5, min_size=0),
        "shards": functools.partial(P.shards, num_clients=num_clients, shards_per_client=1),
        "lognormal": functools.partial(P.lognormal, num_clients=num_clients, sigma=1.5),
        "natural": functools.partial(P.natural),
    }


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 400),
    data=st.data(),
    num_classes=st.integers(1, 12),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_index_assigned_exactly_once(n, data, num_classes, seed):
    num_clients = data.draw(st.integers(1, min(n, 40)), label="num_clients")
    labels = np.random.default_rng(seed).integers(0, num_classes, n)
    groups = np.random.default_rng(seed + 1).integers(0, num_clients, n)
    for name, fn in bound_partitioners(num_clients).items():
        parts = fn(labels, seed=seed, groups=groups)
        assert_exact_cover(parts, n)
        if name != "natural":
            assert len(parts) == num_clients, name


@pytest.mark.parametrize("name", ["iid", "dirichlet", "shards", "lognormal"])
def test_same_seed_same_result_different_seed_different(name):
    labels = balanced_labels(1000)
    fn = bound_partitioners(20)[name]
    assert same(fn(labels, seed=7), fn(labels, seed=7))
    assert not same(fn(labels, seed=7), fn(labels, seed=8))


def test_partitioners_do_not_touch_global_rng():
    np.random.seed(123)
    before = np.random.random()
    np.random.seed(123)
    for fn in bound_partitioners(10).values():
        fn(balanced_labels(200), seed=1, groups=np.arange(200) % 3)
    assert np.random.random() == before


# ---------------------------------------------------------------------------------------------- iid


def test_iid_sizes_differ_by_at_most_one():
    sizes = [len(p) for p in P.iid(np.zeros(1003), num_clients=10, seed=0)]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1003


def test_iid_is_fast_for_100k_clients():
    import time

    labels = np.zeros(200_000, dtype=np.int64)
    start = time.perf_counter()
    parts = P.iid(labels, num_clients=100_000, seed=0)
    assert time.perf_counter() - start < 1.0
    assert len(parts) == 100_000


# ---------------------------------------------------------------------------------------- dirichlet


@pytest.mark.parametrize("seed", range(5))
def test_dirichlet_honours_min_size(seed):
    labels = balanced_labels(2000)
    parts = P.dirichlet(labels, num_clients=20, alpha=0.5, min_size=30, seed=seed)
    assert_exact_cover(parts, 2000)
    assert min(len(p) for p in parts) >= 30


def test_dirichlet_smaller_alpha_more_skew():
    labels = balanced_labels(5000)
    skewed = P.dirichlet(labels, num_clients=20, alpha=0.05, min_size=5, seed=0)
    near_iid = P.dirichlet(labels, num_clients=20, alpha=100.0, min_size=5, seed=0)
    h_skewed, h_iid = mean_label_entropy(skewed, labels), mean_label_entropy(near_iid, labels)
    assert h_skewed < 1.0 < np.log(10) - 0.1 < h_iid


def test_dirichlet_impossible_min_size_gives_clear_error():
    labels = balanced_labels(200)
    with pytest.raises(ValueError, match=r"partition=dirichlet .*partition\.alpha"):
        P.dirichlet(labels, num_clients=20, alpha=0.001, min_size=10, seed=0)


def test_dirichlet_min_size_forces_redraws():
    # with alpha=0.1 the first draw leaves some client under 30 examples for most seeds; the
    # redraws must still end with every client at >= 30 (or a clear error, never a short client)
    labels = balanced_labels(4000)
    for seed in range(5):
        parts = P.dirichlet(labels, num_clients=20, alpha=0.1, min_size=30, seed=seed)
        assert min(len(p) for p in parts) >= 30
    first_draws = [P.dirichlet(labels, num_clients=20, alpha=0.1, min_size=0, seed=seed) for seed in range(5)]
    assert any(min(len(p) for p in parts) < 30 for parts in first_draws)


# ------------------------------------------------------------------------------------------- shards


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("per_client", [1, 2, 3])
def test_shards_aligned_clients_see_at_most_shards_per_client_labels(seed, per_client):
    # 10 balanced classes of 120 cut into 60 shards of 20: no shard straddles a class boundary
    labels = balanced_labels(1200, seed=seed)
    num_clients = 60 // per_client
    parts = P.shards(labels, num_clients=num_clients, shards_per_client=per_client, seed=seed)
    assert_exact_cover(parts, 1200)
    assert all(len(np.unique(labels[p])) <= per_client for p in parts)
    assert all(len(p) == 1200 // num_clients for p in parts)
    if per_client > 1:  # shards are dealt at random, not neighbours to the same client
        assert np.mean([len(np.unique(labels[p])) for p in parts]) > per_client - 0.5


@pytest.mark.parametrize("seed", range(5))
def test_shards_unaligned_each_shard_spans_at_most_two_labels(seed):
    labels = balanced_labels(1003, seed=seed)  # 1003 / 70 shards: sizes 14 or 15, straddle classes
    parts = P.shards(labels, num_clients=35, shards_per_client=2, seed=seed)
    assert_exact_cover(parts, 1003)
    assert all(len(np.unique(labels[p])) <= 2 * 2 for p in parts)
    assert all(len(p) in (28, 29, 30) for p in parts)
    # non-IID: far fewer labels per client than the 10 an IID split would give
    assert np.mean([len(np.unique(labels[p])) for p in parts]) < 4


# ---------------------------------------------------------------------------------------- lognormal


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2000), data=st.data(), sigma=st.floats(0, 3), seed=st.integers(0, 10**6))
def test_lognormal_sizes_sum_to_n_and_respect_min_size(n, data, sigma, seed):
    num_clients = data.draw(st.integers(1, min(n, 50)))
    min_size = data.draw(st.integers(1, n // num_clients))
    parts = P.lognormal(np.zeros(n), num_clients=num_clients, sigma=sigma, min_size=min_size, seed=seed)
    sizes = np.array([len(p) for p in parts])
    assert sizes.sum() == n and sizes.min() >= min_size
    assert_exact_cover(parts, n)


def test_lognormal_sigma_controls_size_spread():
    labels = np.zeros(100_037)  # not divisible by 100: the remainder must be shared, not dumped
    equal = [len(p) for p in P.lognormal(labels, num_clients=100, sigma=0.0, seed=0)]
    skewed = [len(p) for p in P.lognormal(labels, num_clients=100, sigma=2.0, seed=0)]
    assert max(equal) - min(equal) <= 1
    assert max(skewed) > 10 * np.median(skewed)


# ------------------------------------------------------------------------------------------ natural


def test_natural_matches_groups_in_sorted_order():
    groups = np.array([7, 3, 7, 11, 3, 3, 11, 7])
    parts = P.natural(np.zeros(8), seed=0, groups=groups)
    assert [p.tolist() for p in parts] == [[1, 4, 5], [0, 2, 7], [3, 6]]
    assert all(p.dtype == np.int64 for p in parts)


def test_natural_without_groups_explains_what_to_use():
    msg = (
        "partition=natural needs a dataset with natural clients (data=synthetic, femnist, shakespeare, sent140, "
        "celeba, femnist_tff, the Hugging Face copies, or npz with client_ids); "
        "use partition=iid, dirichlet, shards or lognormal"
    )
    with pytest.raises(ValueError, match=re.escape(msg)):
        P.natural(np.zeros(8), seed=0, groups=None)


# ---------------------------------------------------------------------------------------- validation


BAD_CALLS = [
    (functools.partial(P.iid, num_clients=0), "partition.num_clients"),
    (functools.partial(P.iid, num_clients=1000), "partition.num_clients"),
    (functools.partial(P.iid, num_clients=2.5), "partition.num_clients"),
    (functools.partial(P.dirichlet, num_clients=5, alpha=-1.0), "partition.alpha"),
    (functools.partial(P.dirichlet, num_clients=5, alpha=0), "partition.alpha"),
    (functools.partial(P.dirichlet, num_clients=5, alpha=float("nan")), "partition.alpha"),
    (functools.partial(P.dirichlet, num_clients=5, alpha=1.0, min_size=-1), "partition.min_size"),
    (functools.partial(P.dirichlet, num_clients=50, alpha=1.0, min_size=11), "partition.min_size"),
    (functools.partial(P.shards, num_clients=300, shards_per_client=2), "shards_per_client"),
    (functools.partial(P.shards, num_clients=5, shards_per_client=0), "partition.shards_per_client"),
    (functools.partial(P.lognormal, num_clients=5, sigma=-0.5), "partition.sigma"),
    (functools.partial(P.lognormal, num_clients=5, min_size=0), "partition.min_size"),
    (functools.partial(P.lognormal, num_clients=100, min_size=6), "partition.min_size"),
]


@pytest.mark.parametrize("call, field", BAD_CALLS)
def test_bad_parameters_raise_one_line_error_naming_field(call, field):
    with pytest.raises(ValueError) as info:
        call(np.zeros(500, dtype=np.int64), seed=0)
    assert field in str(info.value) and "\n" not in str(info.value)


def test_num_clients_message_matches_spec():
    with pytest.raises(
        ValueError, match=re.escape("partition.num_clients must be between 1 and the 500 training examples (got 1000)")
    ):
        P.iid(np.zeros(500), num_clients=1000, seed=0)


def test_alpha_message_matches_spec():
    with pytest.raises(ValueError, match=re.escape("partition.alpha must be a finite number > 0 (got -1.0)")):
        P.dirichlet(np.zeros(500), num_clients=5, alpha=-1.0, seed=0)


# --------------------------------------------------------------------------------- split_train_test


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 30), min_size=0, max_size=20),
    test_fraction=st.floats(0, 0.99),
    seed=st.integers(0, 10**6),
)
def test_split_train_test_partitions_each_client(sizes, test_fraction, seed):
    indices = P.iid(np.zeros(sum(sizes)), num_clients=1, seed=seed)[0] if sum(sizes) else []
    parts = np.split(np.asarray(indices, dtype=np.int64), np.cumsum(sizes)[:-1]) if sizes else []
    train, test = split_train_test(parts, test_fraction, seed=seed)
    assert len(train) == len(test) == len(parts)
    for part, tr, te in zip(parts, train, test, strict=True):
        assert tr.dtype == te.dtype == np.int64
        assert np.array_equal(np.sort(np.concatenate([tr, te])), np.sort(part))
        n = len(part)
        assert len(te) == min(round(test_fraction * n), max(n - 1, 0))
        if n >= 1:
            assert len(tr) >= 1


def test_split_train_test_deterministic_and_seeded():
    parts = P.iid(np.zeros(1000), num_clients=10, seed=0)
    a = split_train_test(parts, 0.25, seed=1)
    b = split_train_test(parts, 0.25, seed=1)
    c = split_train_test(parts, 0.25, seed=2)
    assert same(a[0], b[0]) and same(a[1], b[1])
    assert not same(a[1], c[1])
    assert [len(t) for t in a[1]] == [25] * 10


def test_split_train_test_is_fast_for_100k_clients():
    import time

    parts = P.iid(np.zeros(500_000), num_clients=100_000, seed=0)
    start = time.perf_counter()
    train, test = split_train_test(parts, 0.2, seed=0)
    assert time.perf_counter() - start < 3.0
    assert sum(map(len, test)) == 100_000 and sum(map(len, train)) == 400_000


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan")])
def test_split_train_test_rejects_bad_fraction(bad):
    with pytest.raises(ValueError, match="client_test_fraction"):
        split_train_test([np.arange(10)], bad, seed=0)
