"""A malformed update is a rejected update with the same reason under every executor, never a dead worker."""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import fault_clients  # noqa: E402
from builders import tiny_federation, tiny_server  # noqa: E402

from fedsim.executor import ProcessExecutor, RayExecutor, SerialExecutor  # noqa: E402
from fedsim.observe.run_logger import RunLogger  # noqa: E402

VICTIM = 3


def _run(executor, kind: str, caplog: pytest.LogCaptureFixture) -> tuple[list[str], list[dict]]:  # type: ignore[no-untyped-def]
    server = tiny_server(
        tiny_federation(6, max_size=40, seed=1, client_test_fraction=0.0),
        client=functools.partial(fault_clients.MalformedClient, victim=VICTIM, kind=kind, epochs=1, batch_size=8),
        executor=executor,
        num_rounds=2,
        clients_per_round=6,
        logger=RunLogger(None, tensorboard=False, progress=False),
        central_test=False,
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedsim"):
        result = server.run()
    reasons = [r.getMessage() for r in caplog.records if " rejected: " in r.getMessage()]
    return reasons, result.history


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["shape", "list"])
def test_the_same_rejection_under_serial_process_and_ray(
    kind: str, caplog: pytest.LogCaptureFixture, local_ray
) -> None:  # type: ignore[no-untyped-def]
    from ray import cloudpickle

    serial_reasons, serial = _run(SerialExecutor(), kind, caplog)
    expected = "params has shape (607,)" if kind == "shape" else "params is a list, not a tensor"
    assert len(serial_reasons) == 2 and all(f"client {VICTIM}: {expected}" in r for r in serial_reasons), serial_reasons
    process_reasons, process = _run(ProcessExecutor(devices="cpu", workers=2, max_retries=0), kind, caplog)
    cloudpickle.register_pickle_by_value(fault_clients)  # Ray workers do not share this test's sys.path
    ray_reasons, on_ray = _run(RayExecutor(workers=2, max_retries=0, reuse_actors=True), kind, caplog)
    assert process_reasons == serial_reasons == ray_reasons
    for history in (process, on_ray):
        assert [r["client/num_rejected"] for r in history] == [1.0, 1.0]
        assert [r["train/loss"] for r in history] == [r["train/loss"] for r in serial]
