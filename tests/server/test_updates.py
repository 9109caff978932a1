"""Bad client updates are rejected with a reason and never reach the global model."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest
import torch
from builders import tiny_federation, tiny_server

from fedsim.client.base import Client
from fedsim.core.types import ClientUpdate
from fedsim.core.update_checks import rejection_reason
from fedsim.observe.run_logger import RunLogger
from fedsim.server.server import Server


def _update(params: torch.Tensor, n: int = 3) -> ClientUpdate:
    return ClientUpdate(client_id=0, round_num=1, params=params, num_examples=n)


def test_rejection_reasons() -> None:
    ref = torch.zeros(4)
    assert rejection_reason(_update(torch.ones(4)), ref) is None
    assert "shape (5,)" in rejection_reason(_update(torch.ones(5)), ref)
    assert "dtype torch.float64" in rejection_reason(_update(torch.ones(4, dtype=torch.float64)), ref)
    assert "2 non-finite" in rejection_reason(_update(torch.tensor([1.0, float("nan"), float("inf"), 0.0])), ref)
    assert "num_examples" in rejection_reason(_update(torch.ones(4), n=0), ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_finiteness_check_at_the_edges_of_the_range(dtype: torch.dtype) -> None:
    """Values at the largest finite magnitude pass (a sum must not overflow into a false alarm); a lone
    inf, opposite infs (whose sum is NaN) and a NaN among huge values are caught, in every float type."""
    top = torch.finfo(dtype).max
    ref = torch.zeros(1000, dtype=dtype)
    assert rejection_reason(_update(torch.full((1000,), top, dtype=dtype)), ref) is None
    assert rejection_reason(_update(torch.full((1000,), -top, dtype=dtype)), ref) is None
    for bad in ([float("-inf")], [float("inf"), float("-inf")], [float("nan")]):
        params = torch.full((1000,), top, dtype=dtype)
        params[: len(bad)] = torch.tensor(bad, dtype=dtype)
        assert f"{len(bad)} non-finite" in rejection_reason(_update(params), ref)


class NaNClient(Client):
    """Returns NaN weights when its id is in ``bad``."""

    def __init__(self, *args, bad=(), **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.bad = bad

    def fit(self, model, data, **kwargs):  # type: ignore[no-untyped-def]
        update = super().fit(model, data, **kwargs)
        if self.client_id in self.bad:
            update = dataclasses.replace(update, params=torch.full_like(update.params, float("nan")))
        return update


def _server(bad, run_dir=None) -> Server:  # type: ignore[no-untyped-def]
    return tiny_server(
        tiny_federation(6, max_size=40, seed=2),
        client=functools.partial(NaNClient, bad=bad),
        num_rounds=2,
        clients_per_round=6,
        logger=RunLogger(run_dir, progress=False),
    )


def test_a_nan_update_is_rejected_and_logged(tmp_path: Path) -> None:
    result = _server(bad=(2,), run_dir=tmp_path).run()
    assert torch.isfinite(result.params).all()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["client/num_rejected"] for r in records] == [1.0, 1.0]
    assert all(2 not in [c["client_id"] for c in r["clients"]] for r in records)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    assert "rejected/text_summary" in events.Tags()["tensors"]


def test_a_round_with_only_bad_updates_keeps_the_previous_model() -> None:
    server = _server(bad=tuple(range(6)))
    initial = server.params.clone()
    result = server.run()
    assert torch.equal(result.params, initial)
