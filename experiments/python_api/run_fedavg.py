"""FedAvg on Synthetic(1,1) from plain Python, three ways.

1. By hand: data → partition → clients → model factory → Server(FedAvg, SerialExecutor, RunLogger).
   This is the default experiment of ``python -m fedsim`` with 15 instead of 30 rounds.
2. Through the Hydra config tree: ``run_config(compose([...]))``. Same seed and settings as (1), so the
   final weights must be bitwise identical.
3. A custom ``Client`` subclass that carries its own hyper-parameters (label smoothing in ``loss``,
   gradient clipping in ``train_step``).

Run from the repository root:  .venv/bin/python experiments/python_api/run_fedavg.py
"""

from __future__ import annotations

import functools
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from fedsim import Client, FedAvg, RunLogger, SerialExecutor, Server, federate, make_clients
from fedsim.data.partition import natural
from fedsim.data.synthetic import synthetic
from fedsim.models import LogisticRegression
from fedsim.run import compose, run_config
from fedsim.seeding import partition_seed
from fedsim.server import Federation, Schedule

SEED, ROUNDS, CLIENTS_PER_ROUND = 0, 15, 10


class SmoothedClippedClient(Client):
    """A client with its own local-training hyper-parameters.

    Extra hyper-parameters go in ``__init__`` (keyword-only); the rest (epochs, batch_size, optimizer)
    pass through to ``Client``. The model is *not* stored here: ``fit`` receives it from the executor.
    """

    def __init__(self, client_id, train_indices, test_indices=(), *, smoothing=0.1, max_grad_norm=1.0, **kwargs):
        super().__init__(client_id, train_indices, test_indices, **kwargs)
        self.smoothing = smoothing
        self.max_grad_norm = max_grad_norm

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(model(x), y, label_smoothing=self.smoothing)

    def train_step(self, model, optimizer, x, y) -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = self.objective(model, x, y)  # loss + the strategy's client-side term, if any
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), self.max_grad_norm)
        optimizer.step()
        return float(loss.detach())


def build_server(client_cls: type[Client] = Client, run_dir: Path | None = None, **client_kwargs) -> Server:
    """The default experiment (``python -m fedsim``), assembled by hand."""
    split = synthetic(alpha=1.0, beta=1.0, num_devices=30, seed=SEED)  # DataSplit(train, test)
    data = federate(split, natural, client_test_fraction=0.2, seed=partition_seed(SEED))  # one client per device
    client_factory = functools.partial(
        client_cls, epochs=1, batch_size=10, optimizer=functools.partial(torch.optim.SGD, lr=0.01), **client_kwargs
    )
    clients = make_clients(data, client_factory)  # calls client_factory(client_id=, train_indices=, test_indices=)
    model_factory = functools.partial(
        LogisticRegression, input_shape=data.train.input_shape, num_classes=data.train.num_classes
    )
    return Server(
        model_factory=model_factory,
        federation=Federation(clients=clients, train_data=data.train, test_data=data.test),
        strategy=FedAvg(),
        executor=SerialExecutor(),
        schedule=Schedule(num_rounds=ROUNDS, clients_per_round=CLIENTS_PER_ROUND),
        seed=SEED,
        logger=RunLogger(run_dir, progress=False),
    )


def accuracy(history: list[dict]) -> str:
    """Final and best centralized test accuracy of a run."""
    accs = [r["eval/accuracy"] for r in history if r.get("eval/accuracy") is not None]
    return f"final test accuracy {accs[-1]:.4f} (best {max(accs):.4f})"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        by_hand = build_server(run_dir=Path(tmp) / "by_hand").run()
        files = sorted(p.name for p in (Path(tmp) / "by_hand").iterdir())
        print(
            f"1. by hand:       {accuracy(by_hand.history)} "
            f"({time.perf_counter() - start:.1f} s; wrote {', '.join(files)})"
        )

    start = time.perf_counter()
    cfg = compose([f"seed={SEED}", f"num_rounds={ROUNDS}", f"clients_per_round={CLIENTS_PER_ROUND}", "logger=quiet"])
    via_config = run_config(cfg)  # no run_dir: nothing is written
    same = torch.equal(by_hand.params, via_config.params)
    print(
        f"2. run_config:    {accuracy(via_config.history)} "
        f"({time.perf_counter() - start:.1f} s; weights bitwise identical to 1: {same})"
    )

    start = time.perf_counter()
    custom = build_server(SmoothedClippedClient, smoothing=0.1, max_grad_norm=1.0).run()
    print(f"3. custom client: {accuracy(custom.history)} ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
