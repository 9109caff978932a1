"""A synchronous round on the simulated clock: who is sampled among the online clients, and what each task is sent.

The server calls :func:`clocked_round` instead of sampling on its own when a clock is configured
(:mod:`fedsim.sim.clock` has the time model). Sampling stays a pure function of ``(seed, round)`` and of the clock's
time: the strategy's ``sample`` picks positions among the clients online when the round starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fedsim.client.base import Client
from fedsim.comm.messages import message_nbytes
from fedsim.sim.clock import RoundSchedule, SyncClock
from fedsim.strategy.base import Strategy


def check_sampling(clock: SyncClock, strategy: Strategy) -> None:
    """Refuse, in one line, a strategy with its own ``sample`` when clients can be offline: it would be asked to
    pick among the online clients only, which its own rule (e.g. q-FFL's weights per client id) does not expect."""
    if type(strategy).sample is not Strategy.sample and not clock.profiles.always_online:
        raise ValueError(
            f"clock: {type(strategy).__name__} samples clients its own way, which does not work when some are "
            "offline; use profiles that are always online (clock.always_online=true) or its uniform sampling"
        )


def clocked_round(
    clock: SyncClock,
    strategy: Strategy,
    round_num: int,
    rng: np.random.Generator,
    *,
    clients: Sequence[Client],
    clients_per_round: int,
    config_of: Callable[[int], dict[str, Any]],
    model_bytes: int,
    update_bytes: int,
) -> tuple[RoundSchedule, dict[int, dict[str, Any]]]:
    """The round's schedule and the config of every task that runs (``epochs`` lowered where the deadline cut it);
    ``model_bytes`` and ``update_bytes``: the encoded model each task downloads and the update it uploads
    (:mod:`fedsim.comm`); a task also downloads the arrays of its config
    (:func:`fedsim.comm.messages.message_nbytes`)."""
    online = clock.online_clients()
    picked = strategy.sample(round_num, len(online), clock.sample_size(clients_per_round, len(online)), rng)
    sampled = sorted(int(online[i]) for i in picked)
    configs = {c: config_of(c) for c in sampled}
    epochs = {c: int(configs[c].get("epochs", clients[c].epochs)) for c in sampled}
    schedule = clock.schedule(
        sampled,
        clients_per_round=clients_per_round,
        online=len(online),
        epochs=epochs,
        num_train={c: clients[c].num_train for c in sampled},
        model_bytes={c: model_bytes + message_nbytes(configs[c]) for c in sampled},
        update_bytes=update_bytes,
        keeps_partial=strategy.keeps_stragglers,
    )
    run = {
        t.client_id: configs[t.client_id]
        if t.epochs == epochs[t.client_id]
        else {**configs[t.client_id], "epochs": t.epochs}
        for t in schedule.run
    }
    return schedule, run
