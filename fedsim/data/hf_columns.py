"""Columns of a Hugging Face ``datasets.Dataset`` read into fedsim's tensors (used by :mod:`fedsim.data.hf`).

Every reader takes ``rows``, the source rows in the order the output must have (the loader puts each
client's training rows first and its test rows last, see :class:`~fedsim.data.tensor_data.DataSplit`), and
fills one preallocated array chunk by chunk, so memory stays at the output's own size plus one chunk.

* Image columns (``datasets.Image``): the encoded bytes are taken straight from the Arrow table and decoded
  with PIL on a few threads (PIL's decoders release the GIL), skipping ``datasets``' per-row formatter that
  ``with_format("numpy")`` runs; decoding the PNGs themselves is what costs (~15-30k 28x28 images/s). Output float32
  ``(N, C, H, W)``: ``(pixel / 255 - image_mean) / image_std`` per channel; ``C`` is 1 for grayscale images
  (PIL modes 1, L, LA, or the feature's own ``mode``), else 3 (RGB). Every image must have the same size.
* String columns: character ids of :func:`fedsim.data.text.encode_characters` (LEAF's alphabet; a longer
  string keeps its last ``text_length`` characters, a shorter one is padded with spaces at the start), int64
  ``(N, text_length)``; ``text_length`` defaults to the longest string of the column.
* Numeric columns (``Value`` numbers, ``List``/``Sequence`` of numbers, ``Array2D``..``Array5D``): float32
  ``(N, *shape)`` (a scalar column becomes ``(N, 1)``); every row must have the same shape.
* Labels: ``ClassLabel`` and integer columns as int64 (a ``ClassLabel`` also gives ``num_classes``), string
  columns of single characters as :func:`fedsim.data.text.character_ids` (``num_classes`` 81: LEAF's 80
  characters and the id of any other one, :data:`fedsim.data.text.NUM_CHARACTER_IDS`).
"""

from __future__ import annotations

import io
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

CHUNK_ROWS = 4096
"""Rows decoded per step (and per thread task)."""

_GRAY_MODES = frozenset({"1", "L", "LA"})
_INT_TYPES = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})
_NUMBER_TYPES = _INT_TYPES | {"float16", "float32", "float64"}
_STRING_TYPES = frozenset({"string", "large_string"})


def _kind(feature: Any) -> str:
    """The ``datasets`` feature's class name and dtype, e.g. ``Value('string')`` or ``Audio`` (for messages)."""
    dtype = getattr(feature, "dtype", None)
    return f"{type(feature).__name__}({dtype!r})" if type(feature).__name__ == "Value" else type(feature).__name__


def _is_value(feature: Any, dtypes: frozenset[str] | set[str]) -> bool:
    return type(feature).__name__ == "Value" and feature.dtype in dtypes


def _is_numeric(feature: Any) -> bool:
    """A number, a (nested) list of numbers, or a fixed-shape ``ArrayND`` of numbers."""
    name = type(feature).__name__
    if name == "Value":
        return feature.dtype in _NUMBER_TYPES
    if name in ("List", "LargeList", "Sequence"):
        return _is_numeric(feature.feature)
    return name.startswith("Array") and name[5:-1].isdigit() and feature.dtype in _NUMBER_TYPES


def _arrow_column(ds: Any, column: str) -> pa.ChunkedArray:
    """The column's raw Arrow storage (image bytes, not decoded images), honouring any indices mapping."""
    return ds.select_columns([column]).with_format("arrow")[:].column(column)


def _chunks(n: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + CHUNK_ROWS, n)) for lo in range(0, n, CHUNK_ROWS)]


def _taken(column: pa.ChunkedArray, rows: np.ndarray) -> pa.Array:
    """``column[rows]`` as one Arrow array."""
    return column.take(pa.array(rows, type=pa.int64())).combine_chunks()


def read_features(
    ds: Any, column: str, rows: np.ndarray, *, image_mean: Any, image_std: Any, text_length: int | None, where: str
) -> torch.Tensor:
    """The feature tensor of ``ds[column]`` for ``rows`` (see the module docstring for each kind)."""
    feature = ds.features[column]
    if type(feature).__name__ == "Image":
        return _images(_arrow_column(ds, column), rows, feature, image_mean, image_std, f"{where}, column {column!r}")
    if _is_value(feature, _STRING_TYPES):
        return _texts(_arrow_column(ds, column), rows, text_length, f"{where}, column {column!r}")
    if _is_numeric(feature):
        return _numbers(ds, column, rows, f"{where}, column {column!r}")
    raise ValueError(
        f"data: {where}: feature column {column!r} is {_kind(feature)}, which fedsim cannot read as "
        "features; use an Image, string or numeric (array) column as data.feature_column"
    )


def _channel_constants(values: Any, channels: int, name: str) -> torch.Tensor:
    """``image_mean`` / ``image_std`` (one number, or one per channel) shaped ``(1, C, 1, 1)``."""
    flat = np.atleast_1d(np.asarray(values, dtype=np.float32)).ravel()
    if flat.size == 1:
        flat = np.repeat(flat, channels)
    if flat.size != channels:
        raise ValueError(
            f"data.{name} has {flat.size} values but the images have {channels} channel(s); "
            "give one number or one per channel"
        )
    if not np.isfinite(flat).all():
        raise ValueError(f"data.{name} must be finite numbers (got {flat.tolist()})")
    if name == "image_std" and (flat <= 0).any():
        raise ValueError(f"data.image_std must be > 0 (got {flat.tolist()})")
    return torch.from_numpy(flat.copy()).view(1, channels, 1, 1)


def _open_image(data: bytes | None, path: str | None, row: int, where: str) -> Any:
    """A PIL image from the stored bytes, or from the stored file path when the row has no bytes."""
    from PIL import Image, UnidentifiedImageError

    try:
        if data is not None:
            return Image.open(io.BytesIO(data))
        if path:
            return Image.open(os.path.expanduser(path))
    except (OSError, UnidentifiedImageError) as err:
        raise ValueError(f"data: {where}: row {row} is not a readable image ({type(err).__name__}: {err})") from None
    raise ValueError(f"data: {where}: row {row} has no image (neither bytes nor a path)")


def _images(column: pa.ChunkedArray, rows: np.ndarray, feature: Any, mean: Any, std: Any, where: str) -> torch.Tensor:
    """Decode every image of ``rows`` into a normalised float32 ``(N, C, H, W)`` tensor."""
    if len(rows) == 0:
        raise ValueError(f"data: {where}: no rows to read")
    first = _taken(column, rows[:1])
    probe = _open_image(first.field("bytes")[0].as_py(), first.field("path")[0].as_py(), int(rows[0]), where)
    mode = feature.mode or ("L" if probe.mode in _GRAY_MODES else "RGB")
    channels = 1 if mode in _GRAY_MODES else 3
    mode = "L" if channels == 1 else "RGB"
    width, height = probe.size
    shift = _channel_constants(mean, channels, "image_mean")
    scale = _channel_constants(std, channels, "image_std")
    out = torch.empty((len(rows), channels, height, width), dtype=torch.float32)

    def decode(bounds: tuple[int, int]) -> None:
        lo, hi = bounds
        part = _taken(column, rows[lo:hi])
        pixels = np.empty((hi - lo, height, width, channels), dtype=np.uint8)
        for i, (data, path) in enumerate(
            zip(part.field("bytes").to_pylist(), part.field("path").to_pylist(), strict=True)
        ):
            image = _open_image(data, path, int(rows[lo + i]), where)
            if image.mode != mode:
                image = image.convert(mode)
            if image.size != (width, height):
                raise ValueError(
                    f"data: {where}: row {int(rows[lo + i])} is {image.size[0]}x{image.size[1]} but row "
                    f"{int(rows[0])} is {width}x{height}; resize the images to one size first"
                )
            pixels[i] = np.frombuffer(image.tobytes(), dtype=np.uint8).reshape(height, width, channels)
        block = torch.from_numpy(pixels).permute(0, 3, 1, 2).to(torch.float32).div_(255.0)
        out[lo:hi] = block.sub_(shift).div_(scale)

    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        list(pool.map(decode, _chunks(len(rows))))
    return out


def _texts(column: pa.ChunkedArray, rows: np.ndarray, length: int | None, where: str) -> torch.Tensor:
    """Character ids ``(N, length)`` int64 of every string of ``rows``."""
    from fedsim.data.text import encode_characters

    _refuse_nulls(column, where)
    if length is None:
        longest = pc.max(pc.utf8_length(column)).as_py()
        length = int(longest or 0)
    if length < 1:
        raise ValueError(f"data.text_length must be >= 1 (got {length}) for {where}")
    out = np.empty((len(rows), length), dtype=np.int64)
    for lo, hi in _chunks(len(rows)):
        out[lo:hi] = encode_characters(_taken(column, rows[lo:hi]).to_pylist(), length)
    return torch.from_numpy(out)


def _numbers(ds: Any, column: str, rows: np.ndarray, where: str) -> torch.Tensor:
    """float32 ``(N, *shape)`` of a numeric column; rows of different shapes are refused."""
    table = ds.select_columns([column]).with_format("numpy")
    out: np.ndarray | None = None
    for lo, hi in _chunks(len(rows)):
        values = table[rows[lo:hi].tolist()][column]
        if values.dtype == object:
            raise ValueError(
                f"data: {where}: rows hold arrays of different lengths (or missing values) between rows "
                f"{int(rows[lo:hi].min())} and {int(rows[lo:hi].max())}; every row needs the same shape"
            )
        values = values.reshape(len(values), -1) if values.ndim == 1 else values
        if out is None:
            out = np.empty((len(rows), *values.shape[1:]), dtype=np.float32)
        if values.shape[1:] != out.shape[1:]:
            raise ValueError(
                f"data: {where}: rows have shapes {out.shape[1:]} and {values.shape[1:]}; "
                "every row needs the same shape"
            )
        out[lo:hi] = values
    return torch.from_numpy(out if out is not None else np.empty((0, 1), dtype=np.float32))


def _refuse_nulls(column: pa.ChunkedArray, where: str) -> None:
    """One line naming the first empty (null) row of ``column``, if any."""
    if column.null_count:
        first = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"data: {where}: row {first} is empty (null); remove or fill such rows first")


def read_labels(ds: Any, column: str, rows: np.ndarray, where: str) -> tuple[np.ndarray, int | None]:
    """int64 labels of ``rows`` and their number of classes when the column type fixes it: the ``ClassLabel``'s
    size, or 81 for characters (LEAF's 80 and the unknown one); ``None`` for integer columns."""
    feature = ds.features[column]
    arrow = _arrow_column(ds, column)
    here = f"{where}, column {column!r}"
    _refuse_nulls(arrow, here)
    if type(feature).__name__ == "ClassLabel" or _is_value(feature, _INT_TYPES):
        labels = np.array(_taken(arrow, rows).to_numpy(zero_copy_only=False), dtype=np.int64)
        classes = feature.num_classes if type(feature).__name__ == "ClassLabel" else None
    elif _is_value(feature, _STRING_TYPES):
        from fedsim.data.text import NUM_CHARACTER_IDS

        labels, classes = _character_labels(arrow, rows, column, where), NUM_CHARACTER_IDS
    else:
        raise ValueError(
            f"data: {where}: label column {column!r} is {_kind(feature)}; fedsim reads labels from "
            "ClassLabel, integer or single-character string columns"
        )
    if labels.size and labels.min() < 0:
        row = int(rows[int(np.argmin(labels))])
        raise ValueError(
            f"data: {here}: row {row} has label {int(labels.min())}; labels must be 0..num_classes-1 "
            "(drop unlabelled rows first)"
        )
    return labels, classes


def _character_labels(arrow: pa.ChunkedArray, rows: np.ndarray, column: str, where: str) -> np.ndarray:
    """Single-character string labels as LEAF character ids; longer strings are refused."""
    lengths = pc.utf8_length(arrow).to_numpy()
    if (lengths != 1).any():
        row = int(np.flatnonzero(lengths != 1)[0])
        raise ValueError(
            f"data: {where}: label column {column!r} holds strings that are not single characters "
            f"(row {row}: {arrow[row].as_py()!r}); string labels must be single characters"
        )
    from fedsim.data.text import character_ids

    return np.asarray(character_ids(_taken(arrow, rows).to_pylist()), dtype=np.int64)


def read_owners(ds: Any, column: str, where: str) -> np.ndarray:
    """The client column as a numpy array (strings as fixed-width unicode, numbers as int64)."""
    feature = ds.features[column]
    arrow = _arrow_column(ds, column)
    here = f"{where}, column {column!r}"
    _refuse_nulls(arrow, here)
    if _is_value(feature, _STRING_TYPES):
        values = arrow.to_pylist()
        return np.asarray(values, dtype=str) if values else np.empty(0, dtype=str)
    if type(feature).__name__ == "ClassLabel" or _is_value(feature, _INT_TYPES):
        return np.array(arrow.to_numpy(), dtype=np.int64)
    raise ValueError(
        f"data: {where}: client column {column!r} is {_kind(feature)}; use a string or integer column "
        "(one value per client) as data.client_column"
    )
