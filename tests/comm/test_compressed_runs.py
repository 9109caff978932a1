"""Compression in real runs: exact byte counts, the same weights and metrics under every executor and worker count,
exact resume (error-feedback residuals included), the clock timed with the encoded sizes, nothing changed without
compression, and one-line errors for bad settings."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedsim.cli.config import ConfigError
from fedsim.cli.run import build_server, compose
from fedsim.executor.serial import SerialExecutor
from fedsim.server.exchange import RESIDUAL

SHORT = ["num_rounds=4", "logger=quiet", "clients_per_round=5", "eval_every=2", "model=mlp"]
# everything at once: top-k (10 %) then 4-bit QSGD on the uplink with error feedback, float16 on the downlink
STACKED = [
    *SHORT,
    "compression=topk",
    "compression.uplink=[{name: topk, fraction: 0.1}, {name: qsgd, bits: 4, bucket_size: 64}]",
    "compression.downlink=[fp16]",
]


def _measured_free(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "system/"))} for r in history]


@pytest.fixture(scope="module")
def stacked_reference():
    server = build_server(compose(STACKED))
    return server, server.run()


def test_bytes_are_those_of_the_encodings(stacked_reference) -> None:  # noqa: ANN001
    server, result = stacked_reference
    n = server.params.numel()
    k = -(-n // 10)
    up = 4 * k + (-(-k // 64)) * 4 + -(-k * 4 // 8)  # int32 positions, a float32 norm per bucket, 4 bits per value
    assert (server.parts.comm.down_bytes, server.parts.comm.up_bytes) == (2 * n, up)
    for i, record in enumerate(result.history, start=1):
        assert record["comm/bytes_down"] == 5 * 2 * n and record["comm/bytes_up"] == 5 * up
        assert record["comm/bytes_up_total"] == i * 5 * up and record["comm/mb_total"] == pytest.approx(
            i * 5 * (2 * n + up) / 1e6
        )


def test_without_compression_weights_are_unchanged_and_float32_bytes_are_counted() -> None:
    server = build_server(compose(SHORT))
    plain = server.run()
    assert server.parts.comm.compression.lossless
    n = server.params.numel()
    assert all(r["comm/bytes_down"] == r["comm/bytes_up"] == 5 * 4 * n for r in plain.history)
    cast = build_server(compose([*SHORT, "compression=fp16"])).run()
    assert not torch.equal(cast.params, plain.params)  # the codec did act
    assert cast.history[-1]["comm/bytes_up"] == 5 * 2 * n


class RecordingExecutor(SerialExecutor):
    """The serial executor, noting the state keys of every task it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.state_keys: list[set[str]] = []

    def fit(self, global_params, tasks):  # noqa: ANN001, ANN201
        self.state_keys += [set(t.state) for t in tasks]
        return super().fit(global_params, tasks)


def test_error_feedback_residuals_live_in_client_state_and_never_reach_the_worker(stacked_reference) -> None:  # noqa: ANN001
    server, reference = stacked_reference
    states = {c: server.parts.client_states.get(c) for c in server.parts.client_states.clients()}
    assert states and all(RESIDUAL in s and s[RESIDUAL].shape == server.params.shape for s in states.values())
    assert any(s[RESIDUAL].abs().sum() > 0 for s in states.values())
    again = build_server(compose(STACKED))
    again.parts.executor = recording = RecordingExecutor()
    assert torch.equal(again.run().params, reference.params)
    assert len(recording.state_keys) == 4 * 5 and not any(RESIDUAL in keys for keys in recording.state_keys)


@pytest.mark.parametrize("workers", [1, 3])
def test_process_workers_give_the_serial_weights_and_metrics(workers: int, stacked_reference) -> None:  # noqa: ANN001
    _, reference = stacked_reference
    result = build_server(
        compose([*STACKED, "executor=process", "executor.devices=cpu", f"executor.workers={workers}"])
    ).run()
    assert torch.equal(result.params, reference.params)
    assert _measured_free(result.history) == _measured_free(reference.history)


def test_resume_continues_residuals_and_byte_totals_exactly(tmp_path: Path, stacked_reference) -> None:  # noqa: ANN001
    _, reference = stacked_reference
    first = tmp_path / "first"
    build_server(compose([*STACKED, "num_rounds=2", "checkpoint_every=1"]), first).run()
    resumed = build_server(compose([*STACKED, f"resume={first}"]), tmp_path / "second").run()
    assert torch.equal(resumed.params, reference.params)
    assert _measured_free(resumed.history) == _measured_free(reference.history)


def test_the_clock_times_uploads_with_the_encoded_size() -> None:
    clocked = [*SHORT, "clock=sampled", "clock.upload_mbps=0.01", "clock.upload_sigma=0"]
    plain = build_server(compose(clocked))
    sparse = build_server(compose([*clocked, "compression=topk"]))
    saved_bytes = plain.parts.comm.up_bytes - sparse.parts.comm.up_bytes
    assert saved_bytes > 0.9 * plain.parts.comm.up_bytes  # 1 % of the values with their positions
    # every client uploads at exactly 0.01 Mbit/s, so each round ends sooner by the saved bytes' upload time
    for a, b in zip(plain.run().history, sparse.run().history, strict=True):
        assert a["sim/round_s"] - b["sim/round_s"] == pytest.approx(saved_bytes * 8 / 0.01e6, rel=1e-9)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["compression.uplink=[qsgd3]"],
            "compression.uplink[0]: unknown codec 'qsgd3'; use one of fp16, bf16, qsgd, topk, random_mask",
        ),
        (
            ["compression=qsgd", "compression.uplink=[{name: qsgd, bits: 1}]"],
            "compression.uplink[0]: qsgd.bits must be an integer between 2 and 8",
        ),
        (
            ["compression.uplink=[{name: topk, k: 3}]"],
            "compression.uplink[0]: topk got an unexpected keyword argument 'k'",
        ),
        (["compression.downlink=[topk]"], "compression.downlink: TopK(fraction=0.01) would sparsify"),
    ],
)
def test_bad_compression_settings_are_refused_in_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises((ValueError, ConfigError)) as error:
        build_server(compose([*SHORT, *overrides]))
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
