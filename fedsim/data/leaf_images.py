"""Image files decoded into one float32 tensor, for LEAF's CelebA (Caldas et al., "LEAF: A Benchmark for
Federated Settings", 2018, https://github.com/TalwalkarLab/leaf, ``models/celeba/cnn.py``), whose JSON files name
the JPEGs of CelebA's ``img_align_celeba`` folder (Liu et al., "Deep Learning Face Attributes in the Wild",
ICCV 2015, http://mmlab.ie.cuhk.edu.hk/projects/CelebA.html).

Each image is decoded with PIL, converted to RGB and resized to ``size`` x ``size`` with bicubic resampling,
ignoring the aspect ratio, as LEAF's ``img.resize((IMAGE_SIZE, IMAGE_SIZE))`` does (Pillow's default filter).
Then ``(pixel / 255 - mean) / std`` per channel (LEAF itself feeds raw 0..255 values to its CNN). Images are decoded
in chunks on a few threads (PIL's decoders release the GIL) straight into the preallocated output.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from fedsim.core.errors import DatasetNotFoundError

CHUNK = 512
"""Images decoded per task (one uint8 buffer of this many images per thread)."""


def _channels(value: float | Sequence[float], name: str) -> torch.Tensor:
    """A scalar or 3 per-channel constants as a ``(1, 3, 1, 1)`` tensor."""
    values = [float(value)] * 3 if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(values) != 3:
        raise ValueError(f"data: {name} must be one number or 3 (R, G, B), got {list(values)}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"data: {name} must be finite numbers, got {values}")
    if name.endswith("std") and min(values) <= 0:
        raise ValueError(f"data: {name} must be > 0, got {values}")
    return torch.tensor(values, dtype=torch.float32).view(1, 3, 1, 1)


def read_images(
    paths: Sequence[str], size: int, *, mean: float | Sequence[float], std: float | Sequence[float], source: str
) -> torch.Tensor:
    """float32 ``(N, 3, size, size)``: the images at ``paths`` resized and normalised (see the module docstring).

    An unreadable image raises a one-line :class:`DatasetNotFoundError` naming it and ``source`` (where to get
    the files again).
    """
    if int(size) < 1:
        raise ValueError(f"data: image_size must be >= 1, got {size}")
    shift, scale = _channels(mean, "image_mean"), _channels(std, "image_std")
    out = torch.empty((len(paths), 3, size, size), dtype=torch.float32)

    def decode(lo: int) -> None:
        chunk = paths[lo : lo + CHUNK]
        pixels = np.empty((len(chunk), size, size, 3), dtype=np.uint8)
        for i, path in enumerate(chunk):
            pixels[i] = _decode(path, size, source)
        block = torch.from_numpy(pixels).permute(0, 3, 1, 2).to(torch.float32).div_(255.0)
        out[lo : lo + len(chunk)] = block.sub_(shift).div_(scale)

    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        list(pool.map(decode, range(0, len(paths), CHUNK)))
    return out


def _decode(path: str, size: int, source: str) -> np.ndarray:
    """One image as uint8 ``(size, size, 3)``."""
    try:
        with Image.open(path) as image:
            resized = image.convert("RGB").resize((size, size), Image.Resampling.BICUBIC)
    except (OSError, UnidentifiedImageError, SyntaxError) as err:
        detail = " ".join(str(err).split())[:200]
        raise DatasetNotFoundError(
            f"data: cannot read the image {path} ({type(err).__name__}: {detail}); get the images again from {source}"
        ) from None
    return np.asarray(resized, dtype=np.uint8)
