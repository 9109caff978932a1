"""Secure aggregation gives the same weights and the same ``secagg/`` metrics under the serial, process and Ray
executors, bit for bit: the stage runs on the server, and what it simulates of the clients is a pure function of
(seed, round, client) and of their updates, which every executor computes alike; distributed DP's noise too."""

from __future__ import annotations

import pytest
import torch
from secagg_servers import server

from fedsim.executor import ProcessExecutor, RayExecutor
from fedsim.secagg import DistributedDP, SecureAggregation


def _stage(mechanism: str) -> SecureAggregation:
    dp = DistributedDP(mechanism=mechanism, noise_multiplier=0.3)
    return SecureAggregation(seed=1, protocol="secagg_plus", degree=2, bits=16, clip=0.5, dropout=0.2, dp=dp)


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["none", "ddg", "skellam"])
def test_serial_process_and_ray_give_the_same_weights_with_secure_aggregation(local_ray, mechanism: str) -> None:  # noqa: ANN001
    runs = {
        "serial": server(_stage(mechanism), rounds=4).run(),
        "process": server(_stage(mechanism), executor=ProcessExecutor(devices="cpu", workers=2), rounds=4).run(),
        "ray": server(_stage(mechanism), executor=RayExecutor(workers=2, reuse_actors=True), rounds=4).run(),
    }
    keys = [k for k in runs["serial"].history[0] if k.startswith("secagg/")]
    assert sum(r["secagg/dropped"] for r in runs["serial"].history) > 0
    assert ("secagg/dp/epsilon" in keys) == (mechanism != "none")
    for name in ("process", "ray"):
        assert torch.equal(runs[name].params, runs["serial"].params), name
        assert [[r[k] for k in keys] for r in runs[name].history] == [
            [r[k] for k in keys] for r in runs["serial"].history
        ], name
