"""The ``secagg`` stage (fedsim/secagg/stages.py) on hand-made round records and in a Server's rounds: the decoded
aggregate against the survivors' mean computed here, dropouts (the rate, failed clients, the clock's), recovery and
the one-line failure, the bytes and comm/ totals, the noise hook for distributed DP, and b = 32 against plain
FedAvg within the derived bound."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from secagg_servers import server

from fedsim.core.errors import RoundFailedError
from fedsim.core.types import ClientUpdate
from fedsim.secagg import SecureAggregation
from fedsim.secagg.costs import cost_metrics, round_bytes
from fedsim.secagg.masking import complete_graph
from fedsim.server import RoundRecord
from fedsim.sim.clock import RoundSchedule


def _record(round_num: int, ids: list[int], size: int = 5, spread: float = 0.1, **fields: Any) -> RoundRecord:
    generator = torch.Generator().manual_seed(round_num)
    start = torch.randn(size, generator=generator)
    record = RoundRecord(round_num, start, 0.0, start, configs={c: {} for c in ids}, **fields)
    record.kept = [
        ClientUpdate(c, round_num, start + spread * torch.randn(size, generator=generator), num_examples=10 + c)
        for c in ids
    ]
    return record


def _clipped_mean(record: RoundRecord, ids: list[int], clip: float) -> torch.Tensor:
    deltas = [u.params.double() - record.params.double() for u in record.kept if u.client_id in ids]
    return torch.stack([d * min(1.0, clip / float(d.norm())) for d in deltas]).mean(0)


@pytest.mark.parametrize(("protocol", "rotation"), [("secagg", True), ("secagg", False), ("secagg_plus", True)])
def test_the_aggregate_is_the_survivors_clipped_mean_within_the_bound(protocol: str, rotation: bool) -> None:
    ids = list(range(0, 24, 2))
    stage = SecureAggregation(seed=3, protocol=protocol, bits=12, clip=0.2, dropout=0.25, rotation=rotation)
    for round_num in (1, 2, 3):
        record = _record(round_num, ids)
        survivors = [c for c in ids if not stage.drops(round_num, c)]
        metrics = stage.run(record)
        assert [u.client_id for u in record.kept] == survivors and metrics["survivors"] == len(survivors)
        [aggregate] = record.aggregate_input or []
        mean = aggregate.params.double() - record.params.double()
        bound = metrics["error_bound"] + 2**-24 * float(aggregate.params.abs().max())  # the float32 weights
        assert float((mean - _clipped_mean(record, survivors, 0.2)).abs().max()) <= bound
        assert metrics["wrapped"] == 0 and metrics["clipped"] > 0 and metrics["error_max"] <= metrics["error_bound"]
    assert metrics["dropped"] > 0  # (some round lost clients and recovered)


def test_too_few_survivors_fail_the_round_in_one_line() -> None:
    stage = SecureAggregation(seed=0, bits=16, threshold=1.0, dropout=0.3)
    record = _record(5, list(range(8)))
    with pytest.raises(RoundFailedError) as error:
        stage.run(record)
    line = str(error.value)
    assert line.startswith("round 5: secure aggregation (secagg) failed: ") and "\n" not in line
    assert "t=8 of its 8 share holders (secagg.threshold=1.0)" in line and record.aggregate_input is None


def test_clients_that_never_arrived_are_dropouts_the_clock_s_included() -> None:
    """The cohort is who started the round: the clock's sampled clients (a dropped one has no update), or the tasks'
    clients (a failed one has none). Their masks are removed like a rate dropout's."""
    schedule = RoundSchedule(start_s=0.0, online=10, sampled=tuple(range(8)), run=())
    record = _record(2, [0, 1, 3, 4, 6], schedule=schedule)
    metrics = SecureAggregation(seed=1, bits=16).run(record)
    assert (metrics["cohort"], metrics["survivors"], metrics["dropped"]) == (8, 5, 3)
    failed = _record(2, [0, 1, 3])
    failed.configs[7] = {}  # its task failed: no update
    assert SecureAggregation(seed=1).run(failed)["dropped"] == 1


def test_the_bytes_are_the_cost_model_s_and_comm_totals_follow(tmp_path: Any) -> None:
    stage = SecureAggregation(seed=0, bits=16, rotation=True)
    totals = {"up": 0, "down": 0}
    for round_num in (1, 2):
        record = _record(round_num, [0, 1, 2, 3])
        plain_up, down = 4 * 20, 4 * 30
        totals["up"] += plain_up
        totals["down"] += down
        record.metrics.update(
            {
                "comm/bytes_up": plain_up,
                "comm/bytes_down": down,
                "comm/bytes_up_total": totals["up"],
                "comm/bytes_down_total": totals["down"],
            }
        )
        metrics = stage.run(record)
        expected = cost_metrics(round_bytes(complete_graph([0, 1, 2, 3]), [0, 1, 2, 3], coordinates=8, bits=16))
        assert {k: metrics[k] for k in expected} == expected and metrics["bytes_server"] == 4 * 736
        assert record.metrics["comm/bytes_up"] == expected["bytes_up"]
        assert record.metrics["comm/bytes_down"] == down + expected["bytes_down"]
    assert record.metrics["comm/bytes_up_total"] == 2 * expected["bytes_up"]
    assert record.metrics["comm/bytes_down_total"] == totals["down"] + 2 * expected["bytes_down"]
    resumed = SecureAggregation(seed=0, bits=16)
    resumed.load_state_dict(stage.state_dict())
    assert resumed.state_dict() == {
        "bytes_up_offset": stage.comm.up_offset,
        "bytes_down_offset": stage.comm.down_offset,
    }


class _PlusOne(SecureAggregation):
    """Distributed DP's place: every client adds 1 to each integer; the default scale keeps room for n of them."""

    def client_noise(self, round_num: int, client_id: int, size: int) -> torch.Tensor | None:
        return torch.ones(size, dtype=torch.int64)

    def noise_headroom(self, cohort: int) -> int:
        return cohort


def test_the_noise_hook_adds_before_masking_and_the_scale_keeps_room() -> None:
    record = _record(1, [0, 1, 2, 3])
    metrics = _PlusOne(seed=0, bits=8, clip=0.2, rotation=False).run(record)
    assert metrics["scale"] == ((2**7 - 1 - 4) // 4) / 0.2 and metrics["wrapped"] == 0
    mean = record.aggregate_input[0].params.double() - record.params.double() if record.aggregate_input else None
    assert mean is not None  # the noise adds 1/s to every coordinate of the mean: 4 clients' 1 each, over 4
    shifted = _clipped_mean(record, [0, 1, 2, 3], 0.2) + 1 / metrics["scale"]
    assert float((mean - shifted).abs().max()) <= metrics["error_bound"] + 2**-24 * 4


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"bits": 7}, "secagg.bits must be in [8, 32] (got 7)"),
        ({"bits": 16.0}, "secagg.bits"),
        ({"clip": 0}, "secagg.clip must be a finite number > 0"),
        ({"scale": -1.0}, "secagg.scale"),
        ({"threshold": 0}, "secagg.threshold"),
        ({"dropout": 1.0}, "secagg.dropout must be in [0, 1)"),
        ({"rotation": "no"}, "secagg.rotation"),
        ({"protocol": "secagg_plus", "degree": 3}, "secagg.degree must be an even integer >= 2"),
        ({"degree": 4}, "secagg.degree must be null with secagg=secagg"),
        ({"protocol": "bonawitz"}, "secagg.protocol must be one of secagg, secagg_plus"),
        ({"bits": 8, "clients_per_round": 200}, "secagg.bits=8 cannot hold the sum of clients_per_round=200"),
    ],
)
def test_bad_settings_are_one_line_naming_the_key(kwargs: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError) as error:
        SecureAggregation(**kwargs)
    assert key in str(error.value) and "\n" not in str(error.value)


# --- in a server's rounds -------------------------------------------------------------------------------------


@pytest.mark.slow  # training: its first optimizer alone imports torch._dynamo (10 s here)
def test_b32_rounds_equal_plain_fedavg_within_the_derived_bound() -> None:
    """Each round from the same weights: FedAvg of equal-size clients is their uniform mean; secure aggregation at
    b = 32 with a clip that does not bind decodes it within √d'/s, plus each float32 result's half ulp."""
    secure, plain = server(SecureAggregation(seed=1, bits=32, clip=10.0)), server()
    for each in (secure, plain):
        each.parts.executor.start(each.workload())
    for round_num in (1, 2, 3):
        plain.params = secure.params
        plain.run_round(round_num)
        metrics = secure.run_round(round_num)
        assert metrics["secagg/clipped"] == 0 and metrics["secagg/wrapped"] == 0
        bound = metrics["secagg/error_bound"] + 2**-24 * (plain.params.abs() + secure.params.abs())
        assert bool(((secure.params - plain.params).abs() <= bound).all())
        assert not torch.equal(secure.params, plain.params) or round_num > 1  # quantized: not the same bits
    assert math.isclose(metrics["secagg/error_bound"], math.sqrt(64) / ((2**31 - 1) // 4 / 10.0))
