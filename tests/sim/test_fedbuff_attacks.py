"""Attacks on FedBuff: the malicious clients replace their updates in the server step's buffer (an omniscient attack
sees the buffer's honest updates, each against the version it started from), before encoding; the same run under
every executor, an exact resume, and the malicious clients flagged per server step. And updates the server
rejects (crafted or diverged): dropped from their step, never stalling the run, still counted as sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedsim.attacks.omniscient import ALittleIsEnough
from fedsim.attacks.stage import AttackStage
from fedsim.cli.run import build_server, compose
from fedsim.core.types import ClientUpdate

BUFFERED = [
    "num_rounds=6",
    "logger=quiet",
    "eval_every=3",
    "clock=sampled",
    "strategy=fedbuff",
    "strategy.buffer_size=3",
    "strategy.concurrency=5",
]
# ALIE against the buffer, the crafted updates then top-k encoded with error feedback like every other upload
ATTACKED = [
    *BUFFERED,
    "attack=alie",
    "attack.fraction=0.3",
    "compression=topk",
    "compression.uplink=[{name: topk, fraction: 0.1}]",
]


def _sim(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "system/"))} for r in history]


def test_alie_crafts_from_the_buffer_each_update_against_its_own_start() -> None:
    """Three buffered updates trained from different versions: the malicious ones send their own start weights plus
    μ − z·σ of the three deltas; the honest one passes unchanged."""
    stage = AttackStage(ALittleIsEnough(z=1.0, fraction=0.5), num_clients=3, seed=0)
    bad = stage.malicious(7)
    assert len(bad) == 2  # round(0.5 * 3) = 2 of the 3 clients
    starts = [torch.tensor([0.0, 10.0]), torch.tensor([1.0, 20.0]), torch.tensor([2.0, 30.0])]
    deltas = [torch.tensor([1.0, -1.0]), torch.tensor([2.0, -2.0]), torch.tensor([3.0, -6.0])]
    updates = [
        ClientUpdate(client_id=c, round_num=40 + c, params=starts[c] + deltas[c], num_examples=5, metrics={})
        for c in range(3)
    ]
    out = stage.apply_buffer(updates, starts, round_num=7)
    stacked = torch.stack(deltas).double()
    crafted = (stacked.mean(0) - stacked.std(0, unbiased=False)).float()  # μ = [2, -3], σ = [0.816, 2.16]
    for c, update in enumerate(out):
        expected = starts[c] + crafted if c in bad else updates[c].params
        assert torch.equal(update.params, expected) and update.round_num == 40 + c


def test_sign_flip_by_every_client_mirrors_the_first_server_step() -> None:
    """Every client flips its update: the first step (all from version 0, the same events and clients as without
    the attack) moves the model by minus the honest step, up to float32 rounding."""
    one = [*BUFFERED, "num_rounds=1"]
    start = build_server(compose(one)).params.double()
    honest = build_server(compose(one)).run().params.double() - start
    flipped = build_server(compose([*one, "attack=sign_flip", "attack.fraction=1.0"])).run().params.double() - start
    # each flipped delta is fl(fl(r - d) - r) for the honest d: within 2^-24 (|r| + 2|d|) of -d twice over; the step
    # scales by server_lr (1) and each result is a float32 rounding, 2^-24 of |w| more
    r, d = start.abs().max(), honest.abs().max()
    bound = 2**-23 * (r + 2 * d) + 2**-24 * 2 * (r + d)
    assert honest.abs().max() > 100 * bound
    assert (flipped + honest).abs().max() <= bound


@pytest.fixture(scope="module")
def attacked_reference():
    return build_server(compose(ATTACKED)).run()


def test_attacked_process_workers_give_the_serial_run(attacked_reference) -> None:  # noqa: ANN001
    result = build_server(compose([*ATTACKED, "executor=process", "executor.devices=cpu", "executor.workers=3"])).run()
    assert _sim(result.history) == _sim(attacked_reference.history)
    assert torch.equal(result.params, attacked_reference.params)
    assert not torch.equal(result.params, build_server(compose([*ATTACKED, "attack=none"])).run().params)


def test_attacked_resume_continues_bitwise(tmp_path: Path, attacked_reference) -> None:  # noqa: ANN001
    attacked = [*ATTACKED, "logger.tensorboard=false"]
    build_server(compose([*attacked, "num_rounds=3"]), run_dir=tmp_path / "cut").run()
    resumed = build_server(compose(attacked), run_dir=tmp_path / "cut")
    assert resumed.resume(tmp_path / "cut").name == "round-000003.ckpt"
    result = resumed.run()
    assert _sim(result.history) == _sim(attacked_reference.history)
    assert torch.equal(result.params, attacked_reference.params)


def test_malicious_clients_are_flagged_per_server_step(tmp_path: Path) -> None:
    """``per_round``: a fresh malicious set every server step; each consumed update's row says whether its client is
    in the set of the step that consumed it, and the ``attack/`` counts agree."""
    cfg = compose(
        [*BUFFERED, "attack=sign_flip", "attack.fraction=0.3", "attack.per_round=true", "logger.tensorboard=false"]
    )
    server = build_server(cfg, run_dir=tmp_path)
    server.run()
    assert json.loads((tmp_path / "malicious.json").read_text())["clients"] is None
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    sets = set()
    for row in rows:
        bad = server.parts.attack.attack.malicious(cfg.seed, row["round"], 30)
        sets.add(bad)
        flagged = [c["client_id"] for c in row["clients"] if c["malicious"]]
        assert flagged == [c["client_id"] for c in row["clients"] if c["client_id"] in bad]
        assert row["attack/malicious_aggregated"] == row["attack/malicious_sampled"] == len(flagged)
        assert all(c["bytes_up"] == server.parts.comm.up_bytes for c in row["clients"])
    assert len(rows) == 6 and len(sets) > 1 and sum(r["attack/malicious_aggregated"] for r in rows) > 0


def test_a_buffer_the_server_rejects_whole_keeps_the_model() -> None:
    """Boosted updates overflow float16 on the way up: the server rejects every one after decoding, each step
    consumes none and the model stays as it was (a synchronous round does the same)."""
    server = build_server(
        compose(
            [
                *BUFFERED,
                "num_rounds=2",
                "attack=scaling",
                "attack.boost=1e30",
                "attack.fraction=1.0",
                "compression=fp16",
            ]
        )
    )
    start = server.params.clone()
    result = server.run()
    assert torch.equal(result.params, start)
    assert [r["client/num_aggregated"] for r in result.history] == [0.0, 0.0]
    assert all("sim/staleness_mean" not in r and r["attack/malicious_sampled"] == 3 for r in result.history)


def test_clients_that_all_diverge_do_not_stall_the_run() -> None:
    """Every client's training overflows: each arrival is rejected and counts toward the step's buffer, so every
    step ends with nothing to consume and the model kept, instead of waiting for ever for a sound update."""
    server = build_server(compose([*BUFFERED, "num_rounds=2", "client.optimizer.lr=1e38"]))
    start = server.params.clone()
    result = server.run()
    assert torch.equal(result.params, start)
    assert [(r["client/num_aggregated"], r["client/num_rejected"]) for r in result.history] == [(0.0, 3.0), (0.0, 3.0)]
    # the rejected updates were still sent: their bytes are counted, and they count as failed arrivals
    assert all(
        r["comm/bytes_up"] == 3 * server.parts.comm.up_bytes and r["client/num_failed"] == 3 for r in result.history
    )


def test_a_rejected_dp_sgd_update_still_spends_its_clients_privacy() -> None:
    """A DP-SGD client's update the server rejects was released all the same: its steps go into the local ledger,
    as in a synchronous round (before, FedBuff counted only the consumed updates and reported no privacy spent)."""
    diverging = (
        build_server(compose([*BUFFERED, "num_rounds=1", "client=dpsgd", "client.optimizer.lr=1e38"])).run().history
    )
    sound = build_server(compose([*BUFFERED, "num_rounds=1", "client=dpsgd"])).run().history
    assert diverging[0]["client/num_rejected"] == 3 and sound[0]["client/num_rejected"] == 0
    assert diverging[0]["dp/local_steps_max"] == sound[0]["dp/local_steps_max"] > 0
    assert diverging[0]["dp/local_epsilon_max"] == sound[0]["dp/local_epsilon_max"] > 0
