"""The chunked, vectorised Synthetic(α, β) generator returns bit for bit what the per-device loop returned.

``reference_synthetic_with_models`` below is the generator as it was before it was vectorised (issue #35), copied
verbatim (validation left out): one Python iteration per device, one ``rng.normal`` call per device model, one BLAS
call per device for the labels. Every test compares the new generator with it exactly (``torch.equal``, no
tolerance): the new one draws the same standard normals of the same generator stream in the same order and does the
same float64 operations on them, so nothing may differ, not even a label at a near-tie.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch

from fedsim.data import synthetic as module
from fedsim.data.finite import check_finite
from fedsim.data.synthetic import DeviceModel, synthetic, synthetic_with_models
from fedsim.data.tensor_data import DataSplit, TensorData

# ---- the reference: the generator before vectorisation (fedsim/data/synthetic.py at e6db244) ----


def _ref_device_sizes(
    rng: np.random.Generator, num_devices: int, mean_log: float, sigma_log: float, min_size: int, max_size: int | None
) -> np.ndarray:
    draws = np.minimum(rng.lognormal(mean_log, sigma_log, num_devices), 2.0**62)
    sizes = draws.astype(np.int64) + min_size
    return sizes if max_size is None else np.minimum(sizes, max_size)


def _ref_device_models(
    rng: np.random.Generator, alpha: float, beta: float, num_devices: int, num_features: int, num_classes: int
) -> list[DeviceModel]:
    u = rng.normal(0.0, alpha, num_devices)
    big_b = rng.normal(0.0, beta, num_devices)
    v = rng.normal(big_b[:, None], 1.0, (num_devices, num_features))
    models = []
    for k in range(num_devices):
        w = rng.normal(u[k], 1.0, (num_classes, num_features))
        b = rng.normal(u[k], 1.0, num_classes)
        models.append(DeviceModel(w=w, b=b, v=v[k]))
    return models


def ref_num_test(size: int, test_fraction: float) -> int:
    if test_fraction == 0 or size < 2:
        return 0
    return min(max(round(test_fraction * size), 1), size - 1)


def _ref_to_tensor_data(
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], num_features: int, num_classes: int
) -> TensorData:
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return TensorData(torch.zeros(0, num_features), torch.from_numpy(empty), num_classes, empty)
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    groups = np.concatenate([p[2] for p in parts])
    return TensorData(torch.from_numpy(x), torch.from_numpy(y), num_classes, groups)


def reference_synthetic_with_models(
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    num_devices: int = 30,
    num_features: int = 60,
    num_classes: int = 10,
    test_fraction: float = 0.2,
    seed: int = 0,
    size_mean_log: float = 4.0,
    size_sigma_log: float = 2.0,
    min_size: int = 50,
    max_size: int | None = None,
) -> tuple[DataSplit, list[DeviceModel]]:
    """The generator before issue #35, verbatim but for the argument validation."""
    rng = np.random.default_rng(seed)
    sizes = _ref_device_sizes(rng, num_devices, size_mean_log, size_sigma_log, min_size, max_size)
    models = _ref_device_models(rng, alpha, beta, num_devices, num_features, num_classes)
    std = np.arange(1, num_features + 1, dtype=np.float64) ** -0.6  # sqrt of Σ_jj = j^-1.2
    train, test = [], []
    for k, (size, model) in enumerate(zip(sizes.tolist(), models, strict=True)):
        x = (model.v + rng.standard_normal((size, num_features)) * std).astype(np.float32)
        check_finite(x, "x", owners=k, remedy=f"data.beta={beta} is too large for float32 features; lower it")
        y = model.labels(x)  # from the stored float32 x, so the labels are exactly reproducible
        ids = np.full(size, k, dtype=np.int64)
        cut = size - ref_num_test(size, test_fraction)
        train.append((x[:cut], y[:cut], ids[:cut]))
        test.append((x[cut:], y[cut:], ids[cut:]))
    split = DataSplit(
        train=_ref_to_tensor_data(train, num_features, num_classes),
        test=_ref_to_tensor_data(test, num_features, num_classes),
    )
    return split, models


# ---- the comparisons ----

EQUAL_SIZES = {"size_mean_log": 0.0, "size_sigma_log": 0.0, "min_size": 9}  # 10 examples a device: issue #35's runs


def chunks_of(kwargs: dict[str, Any]) -> list[tuple[int, int]]:
    """The device ranges the new generator cuts this configuration into (so a test can say it spans several)."""
    rng = np.random.default_rng(kwargs.get("seed", 0))
    sizes = _ref_device_sizes(
        rng,
        kwargs.get("num_devices", 30),
        kwargs.get("size_mean_log", 4.0),
        kwargs.get("size_sigma_log", 2.0),
        kwargs.get("min_size", 50),
        kwargs.get("max_size"),
    )
    features, classes = kwargs.get("num_features", 60), kwargs.get("num_classes", 10)
    return module._chunks(sizes, features, classes)


def assert_same_split(new: DataSplit, old: DataSplit) -> None:
    for part_new, part_old in ((new.train, old.train), (new.test, old.test)):
        assert part_new.x.dtype == part_old.x.dtype and part_new.y.dtype == part_old.y.dtype
        assert torch.equal(part_new.x, part_old.x)
        assert torch.equal(part_new.y, part_old.y)
        assert part_new.groups is not None and part_old.groups is not None
        assert part_new.groups.dtype == part_old.groups.dtype
        assert np.array_equal(part_new.groups, part_old.groups)
        assert part_new.num_classes == part_old.num_classes
    assert new.local_test is None and old.local_test is None


def assert_same_models(new: list[DeviceModel], old: list[DeviceModel]) -> None:
    assert len(new) == len(old)
    for m_new, m_old in zip(new, old, strict=True):
        assert m_new.w.dtype == m_new.b.dtype == m_new.v.dtype == np.float64
        assert np.array_equal(m_new.w, m_old.w) and np.array_equal(m_new.b, m_old.b)
        assert np.array_equal(m_new.v, m_old.v)


CONFIGS = {
    "default": {},
    "alpha_beta_zero": {"alpha": 0.0, "beta": 0.0, "seed": 1},
    "one_device": {"num_devices": 1, "seed": 2},
    "equal_sizes_several_chunks": {"num_devices": 4000, "seed": 3, **EQUAL_SIZES},
    "power_law_sizes_several_chunks": {"num_devices": 300, "max_size": 2000, "seed": 4},
    "test_fraction_zero": {"test_fraction": 0.0, "num_devices": 50, "seed": 5},
    "max_size": {"max_size": 80, "num_devices": 100, "seed": 6},
    "one_example_devices": {"num_devices": 700, "size_mean_log": -5.0, "size_sigma_log": 0.0, "min_size": 1},
    "one_or_two_examples": {"num_devices": 300, "size_mean_log": -0.5, "size_sigma_log": 1.0, "min_size": 1},
    "large_beta_alpha": {"alpha": 50.0, "beta": 30.0, "num_devices": 60, "test_fraction": 0.5, "seed": 7},
    "one_feature_two_classes": {"num_features": 1, "num_classes": 2, "num_devices": 40, "seed": 8},
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_same_data_and_models_as_the_per_device_loop(name):
    kwargs = CONFIGS[name]
    new_split, new_models = synthetic_with_models(**kwargs)
    old_split, old_models = reference_synthetic_with_models(**kwargs)
    assert_same_split(new_split, old_split)
    assert_same_models(new_models, old_models)


@pytest.mark.parametrize("name", ["equal_sizes_several_chunks", "power_law_sizes_several_chunks"])
def test_the_large_configurations_span_several_chunks(name):
    assert len(chunks_of(CONFIGS[name])) >= 3


def test_a_device_larger_than_a_chunk_is_one_chunk_of_its_own():
    # Two devices of more rows than a chunk's budget: each is its own chunk, its labels from one BLAS call as before.
    rows = module._CHUNK_ELEMENTS // 60 + 1
    kwargs = {"num_devices": 2, "size_sigma_log": 0.0, "size_mean_log": 0.0, "min_size": rows - 1, "seed": 9}
    assert chunks_of(kwargs) == [(0, 1), (1, 2)]
    new_split, new_models = synthetic_with_models(**kwargs)
    old_split, old_models = reference_synthetic_with_models(**kwargs)
    assert_same_split(new_split, old_split)
    assert_same_models(new_models, old_models)


def test_synthetic_without_models_gives_the_same_split():
    kwargs = CONFIGS["power_law_sizes_several_chunks"]
    old_split, _ = reference_synthetic_with_models(**kwargs)
    assert_same_split(synthetic(**kwargs), old_split)


@pytest.mark.parametrize(
    "sizes",
    [[10] * 300, [1] * 50, [3, 1, 3, 2, 1, 7, 3, 3, 40, 1], [5000, 7, 7], list(range(1, 60))],
    ids=["equal", "ones", "mixed", "one_large", "all_different"],
)
def test_logits_are_bitwise_the_per_device_products(sizes):
    # The labels flip only at a tie within an ulp, so equal labels prove little: the logits themselves must be
    # equal to the bit. A different summation order (one einsum over all rows, a gemv per row) changes the last
    # bits of most of them on such data.
    rng = np.random.default_rng(len(sizes))
    counts = np.array(sizes, dtype=np.int64)
    x = rng.standard_normal((int(counts.sum()), 60)).astype(np.float32)
    w, b = rng.standard_normal((len(counts), 10, 60)), rng.standard_normal((len(counts), 10))
    starts = np.cumsum(counts) - counts
    per_device = [
        x[s : s + n].astype(np.float64) @ w[k].T + b[k] for k, (s, n) in enumerate(zip(starts, counts, strict=True))
    ]
    logits = module._logits(x, w, b, counts)
    assert logits.dtype == np.float64
    assert np.array_equal(logits, np.concatenate(per_device))


def test_test_split_counts_follow_the_scalar_rule():
    # Python's round() and numpy's both round half to even; every (size, fraction) pair, ties included (0.5 * odd).
    sizes = np.arange(1, 400, dtype=np.int64)
    for fraction in (0.0, 0.1, 0.2, 0.25, 0.3, 0.5, 0.75, 0.999, 1e-9):
        expected = [ref_num_test(int(s), fraction) for s in sizes]
        assert module._num_test(sizes, fraction).tolist() == expected


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("beta, num_devices, seed", [(1e40, 3, 0), (1e38, 4000, 8)])
def test_a_beta_too_large_gives_the_same_one_line_error(beta, num_devices, seed):
    # β = 1e40: every device's inputs overflow float32, the first row of device 0 is named. β = 1e38: only the
    # devices with |B_k| > 3.4e38 overflow (B_k ~ N(0, β)); with seed 8 the first is device 2781, in a later chunk.
    kwargs = {"beta": beta, "num_devices": num_devices, "seed": seed, **EQUAL_SIZES}
    with pytest.raises(ValueError) as old:
        reference_synthetic_with_models(**kwargs)
    with pytest.raises(ValueError) as new:
        synthetic_with_models(**kwargs)
    message = str(new.value)
    assert type(new.value) is type(old.value) and message == str(old.value)
    assert "\n" not in message and message.endswith(f"data.beta={beta} is too large for float32 features; lower it")
    client = int(re.search(r"\(client (\d+)\)", message).group(1))
    assert client == 0 if num_devices == 3 else client > chunks_of(kwargs)[1][0]  # past the first chunk
