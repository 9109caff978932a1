"""Whether a client's update may be aggregated at all: the checks every update passes (shape, dtype, finite values,
a positive example count), wherever it is received (the server's rounds, FedBuff's buffer, an attack's view)."""

from __future__ import annotations

import torch

from fedsim.core.types import ClientUpdate


def rejection_reason(update: ClientUpdate, global_params: torch.Tensor) -> str | None:
    """Why ``update`` must not be aggregated, or ``None`` when it is sound.

    Flat vectors stand for the model's state in a fixed key order, so "same keys and shapes" reduces
    to the same length; the dtype must match and every value be finite; the example count positive.
    """
    params = update.params
    if not isinstance(params, torch.Tensor):
        return f"params is a {type(params).__name__}, not a tensor"
    if params.shape != global_params.shape:
        return f"params has shape {tuple(params.shape)} but the global model has {tuple(global_params.shape)}"
    if params.dtype != global_params.dtype:
        return f"params has dtype {params.dtype} but the global model has {global_params.dtype}"
    if not _all_finite(params):
        bad = int((~torch.isfinite(params)).sum())
        return f"params has {bad} non-finite values (NaN or inf)"
    if not isinstance(update.num_examples, int) or update.num_examples <= 0:
        return f"num_examples must be a positive integer (got {update.num_examples!r})"
    return None


def _all_finite(params: torch.Tensor) -> bool:
    """``isfinite(params).all()``; for float32 and narrower as a float64 sum, which no finite values can
    overflow and any NaN or inf reaches, so no boolean tensor as large as the model is allocated."""
    if params.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return bool(torch.isfinite(params.sum(dtype=torch.float64)))
    return bool(torch.isfinite(params).all())
