"""Tests for fedsim.data.synthetic: FedProx Synthetic(α, β) shapes, determinism and statistics."""

from __future__ import annotations

import math
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_runner import run_cli

from fedsim.data.partition import natural
from fedsim.data.reading import refuse_beyond_memory
from fedsim.data.synthetic import memory_estimate, synthetic, synthetic_with_models
from fedsim.data.tensor_data import DataSplit


def all_labels_and_devices(split: DataSplit) -> tuple[np.ndarray, np.ndarray]:
    y = np.concatenate([split.train.labels, split.test.labels])
    g = np.concatenate([split.train.groups, split.test.groups])
    return y, g


def mean_device_label_entropy(split: DataSplit) -> float:
    y, g = all_labels_and_devices(split)
    ents = []
    for k in np.unique(g):
        p = np.bincount(y[g == k], minlength=split.train.num_classes) / np.sum(g == k)
        p = p[p > 0]
        ents.append(-(p * np.log(p)).sum())
    return float(np.mean(ents))


@pytest.fixture(scope="module")
def default_split() -> DataSplit:
    return synthetic()


def test_shapes_and_types(default_split):
    tr, te = default_split.train, default_split.test
    assert tr.x.dtype == te.x.dtype == torch.float32
    assert tr.y.dtype == te.y.dtype == torch.int64
    assert tr.input_shape == te.input_shape == (60,)
    assert tr.num_classes == te.num_classes == 10
    assert tr.groups.dtype == te.groups.dtype == np.int64
    assert len(tr.groups) == len(tr) and len(te.groups) == len(te)


def test_thirty_devices_with_at_least_min_size(default_split):
    _, g = all_labels_and_devices(default_split)
    sizes = np.bincount(g)
    assert len(sizes) == 30 and sizes.min() >= 50
    assert set(np.unique(default_split.train.groups)) == set(range(30))
    assert set(np.unique(default_split.test.groups)) == set(range(30))
    # power law: the biggest device is much larger than the median one
    assert sizes.max() > 5 * np.median(sizes)


def test_test_part_is_last_fraction_of_each_device(default_split):
    tr, te = default_split.train, default_split.test
    for k in range(30):
        n_tr, n_te = int(np.sum(tr.groups == k)), int(np.sum(te.groups == k))
        n = n_tr + n_te
        assert n_te == min(max(round(0.2 * n), 1), n - 1)


def test_max_size_caps_devices_and_test_fraction_zero():
    split = synthetic(max_size=80, test_fraction=0.0, seed=1)
    sizes = np.bincount(split.train.groups)
    assert sizes.max() <= 80 and sizes.min() >= 50
    assert len(split.test) == 0 and split.test.x.shape == (0, 60)


def test_small_devices_keep_train_and_test():
    split = synthetic(min_size=2, size_mean_log=-5.0, size_sigma_log=0.0, test_fraction=0.1, seed=0)
    assert np.all(np.bincount(split.train.groups) == 1)
    assert np.all(np.bincount(split.test.groups) == 1)


def test_labels_in_range_and_not_degenerate(default_split):
    y, _ = all_labels_and_devices(default_split)
    assert y.min() >= 0 and y.max() < 10
    assert len(np.unique(y)) >= 5  # the union of the devices uses many classes


def test_deterministic_per_seed():
    a, b, c = synthetic(seed=3), synthetic(seed=3), synthetic(seed=4)
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.test.y, b.test.y)
    assert np.array_equal(a.train.groups, b.train.groups)
    assert a.train.x.shape != c.train.x.shape or not torch.equal(a.train.x, c.train.x)


def test_labels_are_argmax_of_device_model():
    split, models = synthetic_with_models(seed=5)
    for part in (split.train, split.test):
        x = part.x.numpy().astype(np.float64)
        for k, m in enumerate(models):
            rows = part.groups == k
            logits = x[rows] @ m.w.T + m.b  # recomputed here, independently of DeviceModel.labels
            assert np.array_equal(part.labels[rows], logits.argmax(axis=1))


def test_features_follow_device_mean_and_covariance():
    split, models = synthetic_with_models(seed=2, min_size=3000, max_size=3000, num_devices=3, test_fraction=0.0)
    x = split.train.x.numpy().astype(np.float64)
    expected_var = np.arange(1, 61, dtype=np.float64) ** -1.2
    for k, m in enumerate(models):
        xk = x[split.train.groups == k]
        assert np.allclose(xk.mean(axis=0), m.v, atol=4 * np.sqrt(expected_var / 3000))
        assert np.allclose(xk.var(axis=0) / expected_var, 1.0, atol=0.15)


def test_alpha_spreads_device_models_beta_spreads_inputs():
    # u_k ~ N(0, α) is the mean of every entry of W_k; B_k ~ N(0, β) is the mean of v_k.
    spreads = {}
    for a, b in [(0.0, 0.0), (3.0, 3.0)]:
        _, models = synthetic_with_models(alpha=a, beta=b, num_devices=200, seed=0, max_size=60)
        spreads[a] = (np.std([m.w.mean() for m in models]), np.std([m.v.mean() for m in models]))
    assert spreads[0.0][0] < 0.1 and spreads[0.0][1] < 0.2
    assert 2.5 < spreads[3.0][0] < 3.5 and 2.5 < spreads[3.0][1] < 3.5


def test_beta_increases_label_heterogeneity_across_devices():
    # Larger β moves the devices' input means apart, so each device's labels concentrate on fewer
    # classes: lower mean per-device label entropy.
    low = np.mean([mean_device_label_entropy(synthetic(alpha=0, beta=0, seed=s)) for s in range(4)])
    high = np.mean([mean_device_label_entropy(synthetic(alpha=0, beta=5, seed=s)) for s in range(4)])
    assert high < low - 0.15


def test_alpha_does_not_change_labels_for_a_fixed_seed():
    # A documented property of the published generator: u_k shifts every class logit equally.
    a, b = synthetic(alpha=0.0, seed=9), synthetic(alpha=10.0, seed=9)
    assert torch.equal(a.train.x, b.train.x)
    assert (a.train.y == b.train.y).float().mean() > 0.999


def test_natural_partition_gives_one_client_per_device(default_split):
    parts = natural(default_split.train.labels, seed=0, groups=default_split.train.groups)
    assert len(parts) == 30
    for k, p in enumerate(parts):
        assert np.all(default_split.train.groups[p] == k)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"alpha": -0.5}, "data.alpha"),
        ({"beta": -1}, "data.beta"),
        ({"num_devices": 0}, "data.num_devices"),
        ({"num_features": 0}, "data.num_features"),
        ({"num_classes": 1}, "data.num_classes"),
        ({"test_fraction": 1.0}, "data.test_fraction"),
        ({"min_size": 0}, "data.min_size"),
        ({"max_size": 10}, "data.max_size"),
        ({"size_sigma_log": -1.0}, "data.size_sigma_log"),
    ],
)
def test_bad_parameters_raise_one_line_error_naming_field(kwargs, field):
    with pytest.raises(ValueError) as info:
        synthetic(**kwargs)
    assert field in str(info.value) and "\n" not in str(info.value)


def test_alpha_beta_zero_is_allowed():
    split = synthetic(alpha=0.0, beta=0.0)
    assert len(split.train) > 0


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_a_beta_too_large_for_float32_features_is_refused_in_one_line():
    with pytest.raises(ValueError) as info:
        synthetic(beta=1e40, num_devices=3, seed=0)
    message = str(info.value)
    assert "\n" not in message and "has a non-finite value (" in message
    assert message.endswith("data.beta=1e+40 is too large for float32 features; lower it")


# ---------------------------------------------------------------------------------------- memory (issue #41)


def test_the_memory_estimate_is_its_documented_formula() -> None:
    # 1,000 devices of exp(0 + 0²/2) + 9 = 10 rows: E = 10,000 rows, E_tr = 8,000, F = 60, C = 10.
    # data (4·60 + 16)·10,000 = 2,560,000; generating 48·1,000 + 48·2^20 = 50,379,648 beats federating
    # 64·8,000 + 24·1,000 = 536,000; models 8·1,000·(10·60 + 10 + 60) = 5,360,000 when kept.
    settings = {"num_devices": 1000, "size_mean_log": 0.0, "size_sigma_log": 0.0, "min_size": 9}
    assert memory_estimate(**settings) == 2_560_000 + 50_379_648
    assert memory_estimate(**settings, keep_models=True) == 2_560_000 + 50_379_648 + 5_360_000
    # 10^6 devices of 10 rows: federating 64·8e6 + 24e6 = 536e6 beats generating 48e6 + 48 MiB.
    assert memory_estimate(**{**settings, "num_devices": 10**6}) == 2_560_000_000 + 536_000_000
    # the lognormal's mean exp(4 + 2²/2) = e^6 plus 50 per device, capped by max_size
    expected = 256 * 100 * (math.exp(6) + 50) + 48 * 100 + 48 * 2**20  # float: the sum may round the last unit
    assert abs(memory_estimate(num_devices=100) - expected) <= 1
    assert memory_estimate(num_devices=100, max_size=60) == 256 * 6000 + 48 * 100 + 48 * 2**20


def test_the_million_device_run_of_the_docs_is_not_refused_on_a_24_gib_machine() -> None:
    # issue #35's command (docs/performance.md): 10^6 devices of ten examples, 60 features; estimate only
    estimate = memory_estimate(num_devices=10**6, size_mean_log=0, size_sigma_log=0, min_size=9)
    assert estimate < 24 * 2**30
    refuse_beyond_memory("data.num_devices=1000000", estimate, "the devices", "lower it", available=24 * 2**30)


def test_a_population_beyond_any_memory_is_refused_before_anything_is_allocated() -> None:
    # 10^9 devices of e^6 + 50 ≈ 453 examples: about 127 TiB, more than any machine has
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as error:
            synthetic(num_devices=10**9)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20  # nothing of the 10^9 devices' arrays (8 GB for their sizes alone) was allocated
    message = str(error.value)
    assert "\n" not in message and message.startswith("data.num_devices=1000000000: ")
    assert "need about 126.7 TiB of memory" in message and "available; lower data.num_devices" in message


def test_the_command_line_refuses_it_in_one_line_with_exit_status_2(tmp_path: Path) -> None:
    result = run_cli(["data.num_devices=1000000000", "logger=quiet", f"hydra.run.dir={tmp_path / 'run'}"])
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("fedsim: error: data.num_devices=1000000000: ") and "TiB of memory" in lines[0]
