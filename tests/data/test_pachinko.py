"""fedsim.data.pachinko: TFF's CIFAR-100 Pachinko allocation (Reddi et al. 2021): coverage, client sizes, the
Dirichlet statistics of the clients' label mixes, label exhaustion, determinism, validation and the conf option."""

from __future__ import annotations

import numpy as np
import pytest
from hydra.utils import instantiate
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsim.cli.run import compose
from fedsim.data.pachinko import CIFAR100_COARSE_OF, _draw, _Labels, pachinko

K, F = 20, 5  # CIFAR-100: 20 coarse classes of 5 fine labels


def cifar100_labels(per_label: int, seed: int = 1) -> np.ndarray:
    """``per_label`` examples of each of the 100 fine labels, shuffled."""
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(100), per_label))


def assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    assert all(p.dtype == np.int64 and p.ndim == 1 for p in parts)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(n))


def expected_sizes(n: int, num_clients: int, per_client: int) -> np.ndarray:
    """The documented sizes: ``per_client`` each, then the leftovers ``R`` dealt ``R // C`` each, one more to the
    first ``R % C``."""
    rest = n - per_client * num_clients
    return per_client + rest // num_clients + (np.arange(num_clients) < rest % num_clients)


def sum_sq(counts: np.ndarray) -> float:
    """Unbiased estimate of ``Σ θ²`` from multinomial counts: ``Σ k(k-1) / (n(n-1))`` (needs n ≥ 2)."""
    n = counts.sum()
    return float((counts * (counts - 1)).sum() / (n * (n - 1)))


def mix_stats(parts: list[np.ndarray], labels: np.ndarray) -> tuple[float, float]:
    """Mean over clients of the coarse ``Σθ²`` estimate, and mean over (client, coarse class with ≥ 2 draws) of
    the fine ``Σφ²`` estimate. Under Dir(a) over m categories, ``E[Σθ²] = (a + 1) / (m a + 1)``."""
    coarse_stats, fine_stats = [], []
    for part in parts:
        fine = labels[part]
        coarse = CIFAR100_COARSE_OF[fine]
        counts = np.bincount(coarse, minlength=K)
        coarse_stats.append(sum_sq(counts))
        fine_stats += [sum_sq(np.bincount(fine[coarse == c], minlength=100)) for c in np.flatnonzero(counts >= 2)]
    return float(np.mean(coarse_stats)), float(np.mean(fine_stats))


def dirichlet_sum_sq(a: float, m: int) -> float:
    return (a + 1) / (m * a + 1)


# --- coverage and sizes -------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    n=st.integers(1, 3000),
    num_fine=st.integers(1, 24),
    num_coarse=st.integers(1, 6),
    alpha=st.floats(0.01, 100),
    beta=st.floats(0.01, 100),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_example_once_and_sizes_as_documented(
    data: st.DataObject, n: int, num_fine: int, num_coarse: int, alpha: float, beta: float, seed: int
) -> None:
    coarse_of = np.array(data.draw(st.lists(st.integers(0, num_coarse - 1), min_size=num_fine, max_size=num_fine)))
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, rng.integers(1, num_fine + 1), size=n)  # some fine labels may have no examples
    num_clients = data.draw(st.integers(1, min(n, 40)))
    per_client = data.draw(st.none() | st.integers(1, n // num_clients))
    parts = pachinko(
        labels,
        num_clients=num_clients,
        alpha=alpha,
        beta=beta,
        examples_per_client=per_client,
        seed=seed,
        coarse_of=coarse_of,
    )
    assert len(parts) == num_clients
    assert_exact_cover(parts, n)
    sizes = expected_sizes(n, num_clients, n // num_clients if per_client is None else per_client)
    assert [len(p) for p in parts] == sizes.tolist()
    again = pachinko(
        labels,
        num_clients=num_clients,
        alpha=alpha,
        beta=beta,
        examples_per_client=per_client,
        seed=seed,
        coarse_of=coarse_of,
        groups=np.zeros(n),
    )
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))  # pure in seed; groups ignored


def test_defaults_are_tffs_cifar100_clients() -> None:
    labels = cifar100_labels(500)  # CIFAR-100's training set: 500 of each fine label
    parts = pachinko(labels, seed=0)
    assert len(parts) == 500 and {len(p) for p in parts} == {100}
    assert_exact_cover(parts, 50_000)


@pytest.mark.parametrize(
    ("n", "num_clients", "per_client", "sizes"),
    [
        (1003, 10, None, [101] * 3 + [100] * 7),  # default N // C = 100; the 3 leftovers to the first clients
        (1003, 10, 40, [101] * 3 + [100] * 7),  # 40 each first, then the 603 leftovers: 60 each, 3 get 61
        (1000, 10, 100, [100] * 10),
        (7, 3, 1, [3, 2, 2]),
    ],
)
def test_leftover_examples(n: int, num_clients: int, per_client: int | None, sizes: list[int]) -> None:
    labels = np.arange(n) % 100
    parts = pachinko(labels, num_clients=num_clients, examples_per_client=per_client, seed=3)
    assert [len(p) for p in parts] == sizes
    assert_exact_cover(parts, n)


def test_seeds_differ() -> None:
    labels = cifar100_labels(20)
    a, b = pachinko(labels, num_clients=20, seed=0), pachinko(labels, num_clients=20, seed=1)
    assert not all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


# --- the clients' label mixes follow the Dirichlet parameters -----------------------------------------
# 300 examples per fine label, 300 clients of 100; statistics over the first 100 clients, before much of any
# label is used up (exhaustion changes later clients' mixes, by design). Tolerances are 6 standard deviations
# of these means over seeds, measured over 200 seeds: (0.0154, 0.0079) for alpha=0.1, beta=10 and
# (0.00051, 0.0066) for alpha=10, beta=0.5.
MIX_CASES = [(0.1, 10.0, 0.09, 0.05), (10.0, 0.5, 0.004, 0.04)]
MIX_LABELS = cifar100_labels(300)


@pytest.mark.parametrize(("alpha", "beta", "coarse_tol", "fine_tol"), MIX_CASES)
@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_mixes_match_dirichlet_expectations(
    alpha: float, beta: float, coarse_tol: float, fine_tol: float, seed: int
) -> None:
    parts = pachinko(MIX_LABELS, num_clients=300, alpha=alpha, beta=beta, seed=seed)
    coarse, fine = mix_stats(parts[:100], MIX_LABELS)
    assert coarse == pytest.approx(dirichlet_sum_sq(alpha, K), abs=coarse_tol)
    assert fine == pytest.approx(dirichlet_sum_sq(beta, F), abs=fine_tol)


def test_small_parameters_concentrate_much_more() -> None:
    skewed = mix_stats(pachinko(MIX_LABELS, num_clients=300, alpha=0.1, beta=0.5, seed=5)[:100], MIX_LABELS)
    flat = mix_stats(pachinko(MIX_LABELS, num_clients=300, alpha=10.0, beta=10.0, seed=5)[:100], MIX_LABELS)
    assert skewed[0] > 4 * flat[0]  # coarse: about 0.37 against 0.055
    assert skewed[1] > 1.5 * flat[1]  # fine: about 0.43 against 0.22


# --- exhaustion: one label at a time, renormalised within its coarse class -----------------------------


def _tree(counts: list[int], coarse_of: list[int]) -> _Labels:
    labels = np.repeat(np.arange(len(counts)), counts)
    return _Labels(labels, np.array(coarse_of), np.random.default_rng(0))


def test_an_exhausted_fine_label_leaves_its_coarse_mass_to_its_siblings() -> None:
    # coarse 0 = fine {0 (1 example), 1}; coarse 1 = fine {2}. Once fine 0 is gone, coarse 0 keeps its half and
    # all of it goes to fine 1 (renormalising the joint distribution instead would give fine 1 about 10 %).
    tree = _tree([1, 3000, 3000], [0, 0, 1])
    got = np.concatenate(
        _draw(tree, np.array([0.5, 0.5]), np.array([[0.9, 0.1], [1.0, 0.0]]), 2000, np.random.default_rng(1))
    )
    labels = np.repeat(np.arange(3), [1, 3000, 3000])[got]
    assert len(np.unique(got)) == 2000 and (labels == 0).sum() == 1
    assert (labels == 1).mean() == pytest.approx(0.5, abs=0.06)  # binomial sd 0.011


def test_an_exhausted_coarse_class_is_removed() -> None:
    tree = _tree([2, 3, 1000], [0, 0, 1])
    got = np.concatenate(
        _draw(tree, np.array([0.99, 0.01]), np.array([[0.5, 0.5], [1.0, 0.0]]), 500, np.random.default_rng(2))
    )
    labels = np.repeat(np.arange(3), [2, 3, 1000])[got]
    assert np.bincount(labels, minlength=3).tolist() == [2, 3, 495]


def test_zero_remaining_mass_falls_back_to_uniform() -> None:
    # all of the client's coarse weight is on coarse 0, whose labels have no examples; within coarse 1 all fine
    # weight is on fine 2, which has none: the draws are uniform over what is left (fine 3 only)
    tree = _tree([0, 0, 0, 50], [0, 0, 1, 1])
    got = np.concatenate(
        _draw(tree, np.array([1.0, 0.0]), np.array([[0.5, 0.5], [1.0, 0.0]]), 50, np.random.default_rng(3))
    )
    assert np.array_equal(np.sort(got), np.arange(50))


def test_tight_supply_still_fills_every_client() -> None:
    labels = np.repeat(np.arange(100), 3)  # 300 examples, 100 clients of 3: most draws hit exhausted labels
    parts = pachinko(labels, num_clients=100, alpha=0.01, beta=0.01, seed=0)
    assert [len(p) for p in parts] == [3] * 100
    assert_exact_cover(parts, 300)


# --- validation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_clients": 0}, "partition.num_clients must"),
        ({"num_clients": 201}, "partition.num_clients must"),
        ({"alpha": 0.0}, "partition.alpha must"),
        ({"beta": -1.0}, "partition.beta must"),
        ({"examples_per_client": 0}, "partition.examples_per_client must"),
        ({"examples_per_client": 3}, r"partition.examples_per_client × num_clients must be ≤ the 200"),
        ({"coarse_of": [0, 1, 2]}, "partition.coarse_of must map every label"),
        ({"coarse_of": [[0, 1]]}, "partition.coarse_of must be"),
    ],
)
def test_bad_parameters_are_one_line_errors(kwargs: dict, message: str) -> None:
    args = {"num_clients": 100, **kwargs}
    with pytest.raises(ValueError, match=message) as info:
        pachinko(np.arange(200) % 100, seed=0, **args)
    assert "\n" not in str(info.value)


def test_non_integer_labels_are_refused() -> None:
    with pytest.raises(ValueError, match="partition=pachinko needs integer class labels"):
        pachinko(np.linspace(0, 1, 100), num_clients=2, seed=0)


# --- the conf option ----------------------------------------------------------------------------------


def test_conf_option_has_tffs_defaults() -> None:
    cfg = compose(["partition=pachinko"])
    assert (cfg.partition.num_clients, cfg.partition.alpha, cfg.partition.beta) == (500, 0.1, 10.0)
    parts = instantiate(cfg.partition)(cifar100_labels(500), seed=0, groups=None)
    assert len(parts) == 500 and {len(p) for p in parts} == {100}
