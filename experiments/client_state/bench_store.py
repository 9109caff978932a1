"""Does the disk client-state store cost per round what the sampled clients cost, whatever the federation's size?

Runs the same training (10 clients per round, 3 rounds, checkpoint every round, ``state_store=disk``) over a
federation of 100 clients and one of 100,000, interleaved ``--repeats`` times, with a client that keeps a
Ditto-style personal model (as large as the global model) in its state. Reports the median round time of
each and their ratio, the number of state entries on disk, and the size of the checkpoints.

    .venv/bin/python experiments/client_state/bench_store.py [--repeats 3] [--out results.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fedsim.client import Client
from fedsim.data.tensor_data import TensorData
from fedsim.executor import SerialExecutor
from fedsim.models import MLP2NN
from fedsim.observe.run_logger import RunLogger
from fedsim.server import Checkpoints, Federation, Schedule, Server
from fedsim.strategy import FedAvg

EXAMPLES_PER_CLIENT, FEATURES, ROUNDS, PER_ROUND = 20, 60, 3, 10


class PersonalModelClient(Client):
    """Keeps a model-sized personal vector in its state and moves it halfway to each round's weights."""

    def fit(self, model, data, *, state=None, **kwargs):  # type: ignore[no-untyped-def]
        update = super().fit(model, data, state=state, **kwargs)
        personal = state.get("personal", torch.zeros_like(update.params))
        state["personal"] = 0.5 * (personal + update.params)
        return dataclasses.replace(update, metrics={**update.metrics, "personal_norm": float(state["personal"].norm())})


def federation(num_clients: int, data: TensorData) -> list[Client]:
    """``num_clients`` clients of 20 examples each; their indices wrap around one shared 2,000-example set."""
    pool = len(data)
    make = functools.partial(PersonalModelClient, epochs=1, batch_size=10)
    return [
        make(cid, (np.arange(EXAMPLES_PER_CLIENT) + cid * EXAMPLES_PER_CLIENT) % pool) for cid in range(num_clients)
    ]


def one_run(num_clients: int, data: TensorData, root: Path) -> dict[str, float]:
    run_dir = Path(tempfile.mkdtemp(dir=root, prefix=f"n{num_clients}-"))
    server = Server(
        model_factory=functools.partial(MLP2NN, input_shape=(FEATURES,), num_classes=10, hidden=200),
        federation=Federation(
            clients=federation(num_clients, data), train_data=data, test_data=None, state_store="disk"
        ),
        strategy=FedAvg(),
        executor=SerialExecutor(),
        schedule=Schedule(num_rounds=ROUNDS, clients_per_round=PER_ROUND),
        seed=0,
        logger=RunLogger(run_dir, tensorboard=False, progress=False, client_rows_in_memory=False),
        checkpoints=Checkpoints(dir=run_dir / "checkpoints", every=1),
    )
    result = server.run()
    checkpoints = sorted((run_dir / "checkpoints").glob("round-*.ckpt"))
    entries = list((run_dir / "checkpoints" / "client_state").rglob("*.state"))
    return {
        "round_s": statistics.median(r["time/round_s"] for r in result.history),
        "state_entries": len(entries),
        "state_bytes": sum(p.stat().st_size for p in entries),
        "checkpoint_bytes": checkpoints[-1].stat().st_size,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results_store.json"))
    args = parser.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(2000, FEATURES, generator=g), torch.randint(0, 10, (2000,), generator=g), 10)
    runs: dict[int, list[dict[str, float]]] = {100: [], 100_000: []}
    with tempfile.TemporaryDirectory() as root:
        for _ in range(args.repeats):  # interleaved: both sizes see the same machine load
            for num_clients in runs:
                start = time.perf_counter()
                runs[num_clients].append(one_run(num_clients, data, Path(root)))
                print(
                    f"{num_clients:>7} clients: {runs[num_clients][-1]} ({time.perf_counter() - start:.1f} s in all)",
                    flush=True,
                )
    summary = {n: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for n, rs in runs.items()}
    ratio = summary[100_000]["round_s"] / summary[100]["round_s"]
    print(
        f"median round: {summary[100]['round_s'] * 1e3:.1f} ms (100 clients), "
        f"{summary[100_000]['round_s'] * 1e3:.1f} ms (100,000 clients): ratio {ratio:.2f}"
    )
    args.out.write_text(
        json.dumps({"command": " ".join(sys.argv), "runs": runs, "median": summary, "ratio": ratio}, indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
