"""A strategy's messages are traffic: the arrays in a task's config (SCAFFOLD's control variate c) are counted in
the round's download bytes and the clients' rows, and the simulated clock times their download."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsim.cli.run import build_server, compose
from fedsim.comm.messages import message_nbytes

SHORT = ["num_rounds=3", "logger=quiet", "clients_per_round=5", "eval_every=3", "model=mlp"]


def test_arrays_count_with_their_raw_size_and_scalars_do_not() -> None:
    config = {"c": np.zeros(10, dtype=np.float32), "t": torch.zeros(3, dtype=torch.float64), "lr": 0.1, "epochs": 2}
    assert message_nbytes(config) == 10 * 4 + 3 * 8
    assert message_nbytes({"scaffold_control": np.zeros(0, dtype=np.float32)}) == 0


def test_scaffold_downloads_its_control_variate_with_the_model_from_round_2(tmp_path: Path) -> None:
    server = build_server(compose([*SHORT, "strategy=scaffold", "logger.tensorboard=false"]), run_dir=tmp_path)
    history = server.run().history
    n = server.params.numel()
    # round 1: c = 0 travels as an empty array; afterwards c is as large as the model
    assert [r["comm/bytes_down"] for r in history] == [5 * 4 * n, 5 * 8 * n, 5 * 8 * n]
    assert [r["comm/bytes_up"] for r in history] == [5 * 4 * n] * 3  # c_i⁺ − c_i follows from the weights
    assert history[-1]["comm/bytes_down_total"] == 5 * 4 * n * 5
    rows = [json.loads(line)["clients"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [{row["bytes_down"] for row in clients} for clients in rows] == [{4 * n}, {8 * n}, {8 * n}]


def test_the_clock_times_the_control_variates_download() -> None:
    clocked = [*SHORT, "clock=sampled", "clock.download_mbps=0.01", "clock.download_sigma=0"]
    plain = build_server(compose([*clocked, "strategy=fedavg"]))
    scaffold = build_server(compose([*clocked, "strategy=scaffold"]))
    extra_s = 4 * scaffold.params.numel() * 8 / 0.01e6  # every client downloads c at exactly 0.01 Mbit/s
    differences = [
        b["sim/round_s"] - a["sim/round_s"] for a, b in zip(plain.run().history, scaffold.run().history, strict=True)
    ]
    # the same float64 sums with one term more: exact in round 1, equal to ~1e-15 relative after (1e-9: margin)
    assert differences == pytest.approx([0.0, extra_s, extra_s], rel=1e-9, abs=1e-9)


def test_the_counts_are_the_same_under_process_workers_and_after_a_resume(tmp_path: Path) -> None:
    scaffold = [*SHORT, "strategy=scaffold", "logger.tensorboard=false"]
    whole = build_server(compose(scaffold)).run().history
    workers = (
        build_server(compose([*scaffold, "executor=process", "executor.devices=cpu", "executor.workers=2"]))
        .run()
        .history
    )
    build_server(compose([*scaffold, "num_rounds=2", "eval_every=2"]), run_dir=tmp_path).run()
    resumed = build_server(compose(scaffold), run_dir=tmp_path)
    assert resumed.resume(tmp_path, allow_changes=["eval_every"]).name == "round-000002.ckpt"
    after = resumed.run().history
    keys = ("comm/bytes_down", "comm/bytes_up", "comm/bytes_down_total", "comm/mb_total")
    assert [[r[k] for k in keys] for r in workers] == [[r[k] for k in keys] for r in whole]
    assert [[r[k] for k in keys] for r in after] == [[r[k] for k in keys] for r in whole]
    assert after[-1]["comm/bytes_down"] > after[0]["comm/bytes_down"]  # round 3 (after the resume) still sends c
