"""The Synthetic(α, β) dataset of FedProx.

Li, Sahu, Zaheer, Sanjabi, Talwalkar & Smith, "Federated Optimization in Heterogeneous Networks",
MLSys 2020 (following Shamir, Srebro & Zhang, "Communication-Efficient Distributed Optimization
using an Approximate Newton-type Method", ICML 2014). For device ``k``::

    u_k ~ N(0, α),   W_k ~ N(u_k, 1) (classes × features),   b_k ~ N(u_k, 1) (classes)
    B_k ~ N(0, β),   v_k ~ N(B_k, 1) (features),   Σ = diag(j^-1.2), j = 1..features
    x ~ N(v_k, Σ),   y = argmax softmax(W_k x + b_k)

and device sizes follow the power law of the paper's code, ``int(lognormal(4, 2)) + 50``. As in that
code, the second parameter of every ``N(·, ·)`` above is a standard deviation.

Note on α: because ``u_k`` is one scalar added to every entry of ``W_k`` and ``b_k``, it adds the same
amount to every class's logit, so it changes the device models but not their decisions. With the
same seed, the labels do not depend on α at all (up to floating-point ties); heterogeneity of the
label distributions across devices comes from the per-device draws of ``W_k``, ``b_k`` and from β
(through the input means ``v_k``). This is a property of the published generator, kept as is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import TypeGuard

import numpy as np
import torch

from fedsim.data.finite import check_finite
from fedsim.data.tensor_data import DataSplit, TensorData


@dataclass(frozen=True)
class DeviceModel:
    """The parameters drawn for one device: ``y = argmax(w @ x + b)`` with ``x ~ N(v, diag(cov))``."""

    w: np.ndarray  # (num_classes, num_features)
    b: np.ndarray  # (num_classes,)
    v: np.ndarray  # (num_features,)

    def labels(self, x: np.ndarray) -> np.ndarray:
        """The device's label for every row of ``x`` (computed in float64)."""
        logits = np.asarray(x, dtype=np.float64) @ self.w.T + self.b
        return logits.argmax(axis=1).astype(np.int64)


def _is_int(value: object) -> TypeGuard[Integral]:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_finite_real(value: object) -> TypeGuard[Real]:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _check_nonnegative(name: str, value: object) -> float:
    if not _is_finite_real(value) or value < 0:
        raise ValueError(f"data.{name} must be ≥ 0 (got {value!r})")
    return float(value)


def _check_int(name: str, value: object, lowest: int) -> int:
    if not _is_int(value) or value < lowest:
        raise ValueError(f"data.{name} must be an integer ≥ {lowest} (got {value!r})")
    return int(value)


def _validate(
    alpha: float,
    beta: float,
    num_devices: int,
    num_features: int,
    num_classes: int,
    test_fraction: float,
    size_sigma_log: float,
    min_size: int,
    max_size: int | None,
) -> None:
    """Raise a one-line ``ValueError`` naming the first invalid ``data.*`` field."""
    _check_nonnegative("alpha", alpha)
    _check_nonnegative("beta", beta)
    _check_int("num_devices", num_devices, 1)
    _check_int("num_features", num_features, 1)
    _check_int("num_classes", num_classes, 2)
    _check_nonnegative("size_sigma_log", size_sigma_log)
    _check_int("min_size", min_size, 1)
    if max_size is not None:
        _check_int("max_size", max_size, min_size)
    ok = isinstance(test_fraction, Real) and not isinstance(test_fraction, bool)
    if not ok or not 0 <= test_fraction < 1:
        raise ValueError(f"data.test_fraction must be in [0, 1) (got {test_fraction!r})")


def _device_sizes(
    rng: np.random.Generator, num_devices: int, mean_log: float, sigma_log: float, min_size: int, max_size: int | None
) -> np.ndarray:
    """Power-law sizes ``int(lognormal(mean_log, sigma_log)) + min_size``, capped at ``max_size``."""
    draws = np.minimum(rng.lognormal(mean_log, sigma_log, num_devices), 2.0**62)
    sizes = draws.astype(np.int64) + min_size
    return sizes if max_size is None else np.minimum(sizes, max_size)


def _device_models(
    rng: np.random.Generator, alpha: float, beta: float, num_devices: int, num_features: int, num_classes: int
) -> list[DeviceModel]:
    """Draw ``W_k, b_k, v_k`` for every device (the prior means first, as in the paper's code)."""
    u = rng.normal(0.0, alpha, num_devices)
    big_b = rng.normal(0.0, beta, num_devices)
    v = rng.normal(big_b[:, None], 1.0, (num_devices, num_features))
    models = []
    for k in range(num_devices):
        w = rng.normal(u[k], 1.0, (num_classes, num_features))
        b = rng.normal(u[k], 1.0, num_classes)
        models.append(DeviceModel(w=w, b=b, v=v[k]))
    return models


def _num_test(size: int, test_fraction: float) -> int:
    """``round(test_fraction * size)``, but ≥ 1 and ≤ size - 1 when ``test_fraction > 0``, size ≥ 2."""
    if test_fraction == 0 or size < 2:
        return 0
    return min(max(round(test_fraction * size), 1), size - 1)


def _to_tensor_data(
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], num_features: int, num_classes: int
) -> TensorData:
    """Stack per-device ``(x, y, device_id)`` triples into one :class:`TensorData`."""
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return TensorData(torch.zeros(0, num_features), torch.from_numpy(empty), num_classes, empty)
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    groups = np.concatenate([p[2] for p in parts])
    return TensorData(torch.from_numpy(x), torch.from_numpy(y), num_classes, groups)


def synthetic_with_models(
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
    """Like :func:`synthetic`, but also return the drawn :class:`DeviceModel` of every device."""
    _validate(alpha, beta, num_devices, num_features, num_classes, test_fraction, size_sigma_log, min_size, max_size)
    rng = np.random.default_rng(seed)
    sizes = _device_sizes(rng, num_devices, size_mean_log, size_sigma_log, min_size, max_size)
    models = _device_models(rng, alpha, beta, num_devices, num_features, num_classes)
    std = np.arange(1, num_features + 1, dtype=np.float64) ** -0.6  # sqrt of Σ_jj = j^-1.2
    train, test = [], []
    for k, (size, model) in enumerate(zip(sizes.tolist(), models, strict=True)):
        x = (model.v + rng.standard_normal((size, num_features)) * std).astype(np.float32)
        check_finite(x, "x", owners=k, remedy=f"data.beta={beta} is too large for float32 features; lower it")
        y = model.labels(x)  # from the stored float32 x, so the labels are exactly reproducible
        ids = np.full(size, k, dtype=np.int64)
        cut = size - _num_test(size, test_fraction)
        train.append((x[:cut], y[:cut], ids[:cut]))
        test.append((x[cut:], y[cut:], ids[cut:]))
    split = DataSplit(
        train=_to_tensor_data(train, num_features, num_classes),
        test=_to_tensor_data(test, num_features, num_classes),
    )
    return split, models


def synthetic(
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
) -> DataSplit:
    """Generate FedProx's Synthetic(α, β) data; ``groups`` holds each example's device id.

    Device ``k`` has ``int(lognormal(size_mean_log, size_sigma_log)) + min_size`` examples (at most
    ``max_size`` if given). Its last ``round(test_fraction * n_k)`` examples (at least one and at most
    ``n_k - 1`` when ``test_fraction > 0`` and ``n_k ≥ 2``) go to the centralized test set, the rest
    to the training set, so every device has training data and ``partition=natural`` gives exactly
    ``num_devices`` clients. Examples are ordered by device in both parts. Deterministic in ``seed``.
    """
    split, _ = synthetic_with_models(
        alpha=alpha,
        beta=beta,
        num_devices=num_devices,
        num_features=num_features,
        num_classes=num_classes,
        test_fraction=test_fraction,
        seed=seed,
        size_mean_log=size_mean_log,
        size_sigma_log=size_sigma_log,
        min_size=min_size,
        max_size=max_size,
    )
    return split
