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

The generator draws a chunk of devices at a time (memory stays near the output's size: a million devices of ten
examples take 2.6 GB of data, but would take 5.4 GB of float64 models), yet returns bit for bit what a loop over the
devices returns: the same standard normals of one ``numpy`` stream, combined by the same float64 operations (the
per-device loop it replaced is kept as the reference in tests/data/test_synthetic_vectorised.py).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fedsim.core.checks import integer, number, within
from fedsim.core.progress import progress
from fedsim.data.finite import check_finite
from fedsim.data.reading import refuse_beyond_memory
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


def _validate(
    alpha: float,
    beta: float,
    num_devices: int,
    num_features: int,
    num_classes: int,
    test_fraction: float,
    size_mean_log: float,
    size_sigma_log: float,
    min_size: int,
    max_size: int | None,
) -> None:
    """Raise a one-line ``ValueError`` naming the first invalid ``data.*`` field."""
    number("data.alpha", alpha, at_least=0)
    number("data.beta", beta, at_least=0)
    integer("data.num_devices", num_devices, 1)
    integer("data.num_features", num_features, 1)
    integer("data.num_classes", num_classes, 2)
    number("data.size_mean_log", size_mean_log)
    number("data.size_sigma_log", size_sigma_log, at_least=0)
    integer("data.min_size", min_size, 1)
    if max_size is not None:
        integer("data.max_size", max_size, min_size)
    within("data.test_fraction", test_fraction, "[0, 1)")


def _device_sizes(
    rng: np.random.Generator, num_devices: int, mean_log: float, sigma_log: float, min_size: int, max_size: int | None
) -> np.ndarray:
    """Power-law sizes ``int(lognormal(mean_log, sigma_log)) + min_size``, capped at ``max_size``."""
    draws = np.minimum(rng.lognormal(mean_log, sigma_log, num_devices), 2.0**62)
    sizes = draws.astype(np.int64) + min_size
    return sizes if max_size is None else np.minimum(sizes, max_size)


_CHUNK_ELEMENTS = 1 << 21
"""About how many float64 values one chunk of devices draws at once, inputs and models (16 MiB)."""


@dataclass(frozen=True)
class _Config:
    """The arguments of :func:`synthetic`, checked on construction (a one-line ``ValueError`` naming the field)."""

    alpha: float
    beta: float
    num_devices: int
    num_features: int
    num_classes: int
    test_fraction: float
    seed: int
    size_mean_log: float
    size_sigma_log: float
    min_size: int
    max_size: int | None

    def __post_init__(self) -> None:
        _validate(
            self.alpha,
            self.beta,
            self.num_devices,
            self.num_features,
            self.num_classes,
            self.test_fraction,
            self.size_mean_log,
            self.size_sigma_log,
            self.min_size,
            self.max_size,
        )


@dataclass(frozen=True)
class _Streams:
    """Copies of one generator, each at the start of its part of the stream: the means ``v_k`` of all devices,
    then the models ``W_k, b_k`` of all devices, then the examples of all devices."""

    v: np.random.Generator
    models: np.random.Generator
    x: np.random.Generator


def _skip_normals(rng: np.random.Generator, count: int, advance: Callable[[int], None]) -> None:
    """Move ``rng`` past ``count`` standard normals (drawn a chunk at a time and dropped), telling ``advance`` how
    many each chunk drew."""
    buffer = np.empty(max(1, min(count, _CHUNK_ELEMENTS)))
    for start in range(0, count, len(buffer)):
        rng.standard_normal(out=buffer[: min(len(buffer), count - start)])
        advance(min(len(buffer), count - start))


def _streams(
    rng: np.random.Generator, num_devices: int, num_features: int, num_classes: int, advance: Callable[[int], None]
) -> _Streams:
    """Split the rest of ``rng``'s stream into its three parts (the generator is copied, the draws skipped twice)."""
    v = copy.deepcopy(rng)
    _skip_normals(rng, num_devices * num_features, advance)
    models = copy.deepcopy(rng)
    _skip_normals(rng, num_devices * num_classes * (num_features + 1), advance)
    return _Streams(v=v, models=models, x=rng)


def _draw_models(
    streams: _Streams, u: np.ndarray, big_b: np.ndarray, num_features: int, num_classes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``w`` (devices × classes × features), ``b`` (devices × classes) and ``v`` (devices × features) of a chunk.

    ``rng.normal(loc, 1.0, shape)`` is ``loc + 1.0 * z`` for the standard normals ``z`` in C order, so one
    ``standard_normal`` call of the chunk's shape plus the means gives the per-device calls' values bit for bit:
    ``w_k`` then ``b_k`` of device ``k``, then device ``k + 1``'s."""
    devices = len(u)
    v = big_b[:, None] + streams.v.standard_normal((devices, num_features))
    z = streams.models.standard_normal((devices, num_classes * (num_features + 1)))
    z += u[:, None]
    return z[:, : num_classes * num_features].reshape(devices, num_classes, num_features), z[:, -num_classes:], v


def _draw_inputs(rng: np.random.Generator, v: np.ndarray, sizes: np.ndarray, std: np.ndarray) -> np.ndarray:
    """The float32 examples of a chunk's devices, ``(v_k + z * std).astype(float32)`` row by row as before."""
    z = rng.standard_normal((int(sizes.sum()), len(std)))
    z *= std
    z += np.repeat(v, sizes, axis=0)
    return z.astype(np.float32)


def _logits(x: np.ndarray, w: np.ndarray, b: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``x_k @ w_k.T + b_k`` in float64 for every device ``k`` of a chunk (one row per example), bit for bit as
    :meth:`DeviceModel.labels` computes it.

    The devices of one size share one batched ``matmul``: numpy's loop over the batch calls BLAS once per device
    with the arguments of that device's own ``x_k @ w_k.T`` (shape, transposition, leading dimensions), so every
    sum is added in the same order. One product of all rows would not be: BLAS's blocking depends on the shape."""
    logits = np.empty((len(x), w.shape[1]))
    starts = np.cumsum(sizes) - sizes
    order = np.argsort(sizes, kind="stable")
    values, counts = np.unique(sizes[order], return_counts=True)
    for size, devices in zip(values.tolist(), np.split(order, np.cumsum(counts)[:-1]), strict=True):
        rows = (starts[devices, None] + np.arange(size)).reshape(-1)
        x64 = x[rows].astype(np.float64).reshape(len(devices), size, -1)
        products = np.matmul(x64, w[devices].transpose(0, 2, 1))
        products += b[devices, None, :]
        logits[rows] = products.reshape(len(rows), -1)
    return logits


def _num_test(sizes: np.ndarray, test_fraction: float) -> np.ndarray:
    """``round(test_fraction * size)`` per device (half to even, as Python's ``round``), but ≥ 1 and ≤ size - 1
    when ``test_fraction > 0``, size ≥ 2; 0 otherwise."""
    if test_fraction == 0:
        return np.zeros(len(sizes), dtype=np.int64)
    counts = np.minimum(np.maximum(np.round(test_fraction * sizes), 1), sizes - 1).astype(np.int64)
    return np.where(sizes < 2, 0, counts)


def _chunks(sizes: np.ndarray, num_features: int, num_classes: int) -> list[tuple[int, int]]:
    """Consecutive device ranges that each draw about ``_CHUNK_ELEMENTS`` values (a larger device is one alone)."""
    drawn = np.cumsum(sizes * num_features + num_classes * (num_features + 1))
    bounds, start = [], 0
    while start < len(sizes):
        before = int(drawn[start - 1]) if start else 0
        stop = max(int(np.searchsorted(drawn, before + _CHUNK_ELEMENTS, side="right")), start + 1)
        bounds.append((start, stop))
        start = stop
    return bounds


@dataclass(frozen=True)
class _Output:
    """The arrays the chunks are written into: each part's features, labels and devices, and the models if kept."""

    train: tuple[np.ndarray, np.ndarray, np.ndarray]
    test: tuple[np.ndarray, np.ndarray, np.ndarray]
    train_start: np.ndarray  # the first training row of every device, and the total at the end
    test_start: np.ndarray
    models: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # w, b, v of every device

    @classmethod
    def allocate(cls, sizes: np.ndarray, num_test: np.ndarray, cfg: _Config, keep_models: bool) -> _Output:
        """Empty arrays of the final sizes (the pages are taken as the chunks fill them)."""
        devices, features, classes = cfg.num_devices, cfg.num_features, cfg.num_classes
        ids = np.arange(devices, dtype=np.int64)
        parts = []
        for counts in (sizes - num_test, num_test):
            rows = int(counts.sum())
            parts.append(
                (np.empty((rows, features), np.float32), np.empty(rows, np.int64), np.repeat(ids, counts)),
            )
        models = None
        if keep_models:
            models = (
                np.empty((devices, classes, features)),
                np.empty((devices, classes)),
                np.empty((devices, features)),
            )
        starts = [np.concatenate(([0], np.cumsum(counts))) for counts in (sizes - num_test, num_test)]
        return cls(parts[0], parts[1], starts[0], starts[1], models)

    def put(self, start: int, stop: int, x: np.ndarray, y: np.ndarray, keep: np.ndarray) -> None:
        """Write the rows of devices ``start..stop-1``; ``keep`` is true for the rows that go to training."""
        for (part_x, part_y, _), first, mask in (
            (self.train, self.train_start, keep),
            (self.test, self.test_start, ~keep),
        ):
            rows = slice(int(first[start]), int(first[stop]))
            np.compress(mask, x, axis=0, out=part_x[rows])
            np.compress(mask, y, out=part_y[rows])

    def split(self, num_classes: int) -> DataSplit:
        """The finished arrays as a :class:`DataSplit` (no copy)."""
        train, test = (
            TensorData(torch.from_numpy(x), torch.from_numpy(y), num_classes, groups)
            for x, y, groups in (self.train, self.test)
        )
        return DataSplit(train=train, test=test)


def memory_estimate(
    *,
    num_devices: int = 30,
    num_features: int = 60,
    num_classes: int = 10,
    test_fraction: float = 0.2,
    size_mean_log: float = 4.0,
    size_sigma_log: float = 2.0,
    min_size: int = 50,
    max_size: int | None = None,
    keep_models: bool = False,
) -> int:
    """The bytes that :func:`synthetic` (with ``keep_models``: :func:`synthetic_with_models`) and the federation
    built on its data take at their peak, from the settings alone. With ``N`` devices of ``m`` expected examples,
    ``E = N·m`` rows of which ``E_tr = E·(1 − test_fraction)`` train, ``F`` features and ``C`` classes::

        (4·F + 16)·E            the data: float32 features, int64 labels and device ids, training and test rows
        + max(48·N + 48 MiB,    generating: six int64/float64 arrays per device (sizes, u, B, test counts, first
                                rows, a temporary) and one chunk's draws, inputs and logits (3 × 2^21 float64)
              64·E_tr + 24·N)   federating: the partition's and the local split's int64 indices while they are
                                sorted (8 per training row) and their offsets (3 per device)
        + 8·N·(C·F + C + F)     the device models, kept with ``keep_models`` only

    where ``m = min(exp(size_mean_log + size_sigma_log²/2) + min_size, max_size)``: the mean of the lognormal
    (at least that of its integer part) plus ``min_size``. It is an expectation: a draw with a heavier tail
    than usual takes more."""
    mean_log = min(size_mean_log + size_sigma_log**2 / 2, 700.0)  # exp(709.8) overflows; sizes stop at 2^62 anyway
    per_device = min(math.exp(mean_log), 2.0**62) + min_size
    rows = num_devices * (per_device if max_size is None else min(per_device, max_size))
    data = (4 * num_features + 16) * rows
    generating = 48 * num_devices + 48 * 2**20
    federating = 64 * rows * (1 - test_fraction) + 24 * num_devices
    models = 8 * num_devices * (num_classes * num_features + num_classes + num_features) if keep_models else 0
    return int(data + max(generating, federating) + models)


def _check_memory(cfg: _Config, keep_models: bool) -> None:
    """Refuse, before anything is drawn, a dataset whose :func:`memory_estimate` exceeds the memory available."""
    fields = {key: getattr(cfg, key) for key in ("num_devices", "num_features", "num_classes", "test_fraction")}
    sizes = {key: getattr(cfg, key) for key in ("size_mean_log", "size_sigma_log", "min_size", "max_size")}
    refuse_beyond_memory(
        f"data.num_devices={cfg.num_devices}",
        memory_estimate(**fields, **sizes, keep_models=keep_models),
        f"{cfg.num_devices:,} devices of {cfg.num_features} features and their clients",
        "lower data.num_devices, or the examples per device (data.size_mean_log, data.min_size, data.max_size)",
    )


def _generate(cfg: _Config, *, keep_models: bool) -> tuple[DataSplit, list[DeviceModel]]:
    """Draw the dataset a chunk of devices at a time; the device models are returned only if ``keep_models``.

    The stream is consumed as the published per-device loop consumed it: sizes, ``u``, ``B``, the ``v_k``, all
    device models, then every device's examples; only the order of the arithmetic on its parts changes."""
    _check_memory(cfg, keep_models)
    rng = np.random.default_rng(cfg.seed)
    sizes = _device_sizes(rng, cfg.num_devices, cfg.size_mean_log, cfg.size_sigma_log, cfg.min_size, cfg.max_size)
    u = rng.normal(0.0, cfg.alpha, cfg.num_devices)
    big_b = rng.normal(0.0, cfg.beta, cfg.num_devices)
    per_device = cfg.num_features + cfg.num_classes * (cfg.num_features + 1)  # v_k, then W_k and b_k
    draws = 2 * cfg.num_devices * per_device + int(sizes.sum()) * cfg.num_features  # skipped, then drawn
    with progress(f"data: {cfg.num_devices:,} Synthetic devices", draws, "draw") as advance:
        streams = _streams(rng, cfg.num_devices, cfg.num_features, cfg.num_classes, advance)
        num_test = _num_test(sizes, cfg.test_fraction)
        out = _Output.allocate(sizes, num_test, cfg, keep_models)
        for start, stop in _chunks(sizes, cfg.num_features, cfg.num_classes):
            _fill_chunk(cfg, streams, (u, big_b, sizes, num_test), out, (start, stop))
            advance((stop - start) * per_device + int(sizes[start:stop].sum()) * cfg.num_features)
    models = [] if out.models is None else [DeviceModel(w=w, b=b, v=v) for w, b, v in zip(*out.models, strict=True)]
    return out.split(cfg.num_classes), models


def _fill_chunk(
    cfg: _Config,
    streams: _Streams,
    drawn: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    out: _Output,
    devices: tuple[int, int],
) -> None:
    """Draw the models and examples of the devices ``start..stop-1`` and write them into ``out``; ``drawn``: every
    device's ``u``, ``B``, size and test count."""
    (start, stop), (u, big_b, sizes, num_test) = devices, drawn
    std = np.arange(1, cfg.num_features + 1, dtype=np.float64) ** -0.6  # sqrt of Σ_jj = j^-1.2
    w, b, v = _draw_models(streams, u[start:stop], big_b[start:stop], cfg.num_features, cfg.num_classes)
    chunk_sizes = sizes[start:stop]
    x = _draw_inputs(streams.x, v, chunk_sizes, std)
    first_row = np.cumsum(chunk_sizes) - chunk_sizes
    device = np.repeat(np.arange(start, stop), chunk_sizes)
    local = np.arange(len(x)) - np.repeat(first_row, chunk_sizes)
    remedy = f"data.beta={cfg.beta} is too large for float32 features; lower it"
    check_finite(x, "x", owners=device, rows=local, remedy=remedy)
    y = _logits(x, w, b, chunk_sizes).argmax(axis=1).astype(np.int64, copy=False)
    out.put(start, stop, x, y, local < np.repeat(chunk_sizes - num_test[start:stop], chunk_sizes))
    if out.models is not None:
        for kept, values in zip(out.models, (w, b, v), strict=True):
            kept[start:stop] = values


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
    """Like :func:`synthetic`, but also return the drawn :class:`DeviceModel` of every device.

    The models take ``8 * ((num_classes + 1) * num_features + num_classes)`` bytes a device (5.4 KB by default,
    5.4 GB for a million devices): :func:`synthetic` does not keep them."""
    cfg = _Config(**locals())  # validates every argument first
    return _generate(cfg, keep_models=True)


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
    cfg = _Config(**locals())  # validates every argument first
    split, _ = _generate(cfg, keep_models=False)
    return split
