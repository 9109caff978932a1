"""The Flower side of ``bench_flower.py``: a Message-API ClientApp and ServerApp, driven round by round.

Imported by ``bench_flower.py`` only when the ``flower`` contender runs (or ``--flower-poll-s`` is given),
so that the fedsim side of that benchmark runs without Flower. Ray actors import ``flower_app.client_app``
by name (the driver's ``sys.path``, which includes this folder, is theirs too), so the ClientApp and what it
uses live in this importable module, not in ``__main__``. Needs Flower: see experiments/bench/README.md.
"""

from __future__ import annotations

import os

# before flwr and ray are imported: no telemetry, no update checks, no usage stats (and no network here)
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import queue  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import ray  # noqa: E402
import torch  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.server.superlink.fleet.vce.backend import raybackend  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (the meter)
import workload as wl  # noqa: E402  (the workload's models)
from workload import split_round  # noqa: E402

from fedsim.params import flatten  # noqa: E402
from fedsim.seeding import task_seed  # noqa: E402

# --------------------------------------------------------------------------------------------------
# the Flower ClientApp. Ray actors import it from this module by name (``flower_app.client_app``).

client_app = ClientApp()
_ACTOR_DATA: dict[
    str, Any
] = {}  # per actor process: the training data, loaded once (as Flower's tutorials cache their dataset)


def _actor_data(path: str) -> dict[str, Any]:
    """The training set and the client partition, memory-mapped from the file the driver wrote."""
    if _ACTOR_DATA.get("path") != path:
        blob = torch.load(path, mmap=True, weights_only=True)
        _ACTOR_DATA.clear()
        _ACTOR_DATA.update(path=path, x=blob["x"], y=blob["y"], shares=blob["shares"])
    return _ACTOR_DATA


def local_sgd(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    indices: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
) -> float:
    """Plain PyTorch local training, the same operations as fedsim's ``Client.fit``: per epoch, the
    client's indices shuffled by a generator seeded with fedsim's task seed, batches of ``batch_size``,
    SGD; returns the example-weighted mean loss of the last epoch (fedsim's ``train_loss`` for E=1)."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    mean_loss = float("nan")
    for _ in range(epochs):
        order = indices[torch.randperm(len(indices), generator=generator)]
        total, seen = 0.0, 0
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx], reduction="none").mean()
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(idx)
            seen += len(idx)
        mean_loss = total / max(seen, 1)
    return mean_loss


@client_app.train()
def flower_train(msg: Message, context: Context) -> Message:
    """Flower's idiom: build the model, load the received arrays, train, reply with arrays + metrics."""
    wall_start, t0 = time.time(), time.perf_counter()
    torch.set_num_threads(1)
    config = msg.content["config"]
    data = _actor_data(str(config["data-path"]))
    model = wl.MODELS[str(config["model"])](input_shape=wl.INPUT_SHAPE, num_classes=wl.NUM_CLASSES)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    t1 = time.perf_counter()
    indices = data["shares"][int(config["client-id"])]
    loss = local_sgd(
        model,
        data["x"],
        data["y"],
        indices,
        epochs=int(config["epochs"]),
        batch_size=int(config["batch-size"]),
        lr=float(config["lr"]),
        seed=int(config["task-seed"]),
    )
    t2 = time.perf_counter()
    arrays = ArrayRecord(model.state_dict())
    t3 = time.perf_counter()
    metrics = MetricRecord(
        {
            "train_loss": loss,
            "num-examples": len(indices),
            "client-id": int(config["client-id"]),
            "t-load-s": t1 - t0,
            "t-train-s": t2 - t1,
            "t-pack-s": t3 - t2,
            "torch-threads": torch.get_num_threads(),
            "pid": os.getpid(),
            "t-start": wall_start,
            "t-end": time.time(),
        }
    )
    return Message(content=RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)


# --------------------------------------------------------------------------------------------------
# the Flower ServerApp side: the built-in FedAvg, fedsim's client sample, and a round barrier


class Barrier:
    """Hands rounds between the benchmark driver and Flower's ServerApp thread."""

    def __init__(self, total_rounds: int) -> None:
        self.total_rounds = total_rounds
        self.go: queue.Queue[int | None] = queue.Queue()
        self.done: queue.Queue[tuple[int, ArrayRecord]] = queue.Queue()
        self.replies: dict[int, list[dict[str, float]]] = {}

    def evaluate_fn(self, server_round: int, arrays: ArrayRecord) -> None:
        """``FedAvg.start`` calls this before round 1 (0) and after every round: report, then wait for the
        next round; after the last one, for ``close()`` (so that Flower's shutdown, Ray's included, does
        not overlap the other contenders' rounds)."""
        self.done.put((server_round, arrays))
        if self.go.get() != server_round + 1:
            raise RuntimeError("benchmark aborted")
        return None


class SameClientsFedAvg(FlowerFedAvg):
    """Flower's message-based FedAvg; only the node sample is replaced by fedsim's sample for the round.

    Client ``c`` of fedsim is node ``sorted(node_ids)[c]``; its message's config also carries ``c`` (the
    partition to train on, instead of the node's ``partition-id``) and fedsim's task seed for (round, c).
    Aggregation (``aggregate_train``) is Flower's, unchanged; the replies' metrics are kept for the report.
    """

    def __init__(self, bench: wl.Bench, barrier: Barrier) -> None:
        n = len(bench.client_indices)
        super().__init__(
            fraction_train=bench.per_round / n,
            fraction_evaluate=0.0,
            min_train_nodes=bench.per_round,
            min_evaluate_nodes=0,
            min_available_nodes=n,
        )
        self.bench, self.barrier = bench, barrier

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        while len(node_ids := sorted(grid.get_node_ids())) < len(self.bench.client_indices):
            time.sleep(0.1)
        messages = []
        for cid in self.bench.sampled(server_round):
            cfg = ConfigRecord(
                {
                    **config,
                    "server-round": server_round,
                    "client-id": cid,
                    "task-seed": task_seed(self.bench.seed, server_round, cid),
                }
            )
            content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: cfg})
            messages.append(Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node_ids[cid]))
        return messages

    def aggregate_train(self, server_round: int, replies: Any) -> Any:
        replies = list(replies)
        self.barrier.replies[server_round] = [
            {k: float(v) for k, v in msg.content["metrics"].items()} for msg in replies if not msg.has_error()
        ]
        return super().aggregate_train(server_round, replies)


def set_flower_polling(interval_s: float) -> None:
    """DIAGNOSTIC, not Flower's behaviour: make the engine's two 100 ms polling loops poll every ``interval_s``.

    Flower 1.42's Simulation Engine moves messages by polling: a thread takes each node's pending
    instructions from the in-memory LinkState every 0.1 s (``vce_api.add_messages_to_queue``), and the
    ServerApp's ``InMemoryGrid.send_and_receive`` looks for replies every ``pull_interval`` = 0.1 s. This
    replaces the first with the same loop at another interval and sets the second, to measure how much
    of a round those waits are (``--flower-poll-s``)."""
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.superlink.grid import inmemory_grid

    def add_messages_to_queue(state: Any, message_queue: Any, nodes_mapping: Any, f_stop: threading.Event) -> None:
        while not f_stop.is_set():
            for node_id in nodes_mapping:
                for msg in state.get_message_ins(node_id=node_id, limit=1):
                    message_queue.put(msg)
            f_stop.wait(interval_s)

    vce_api.add_messages_to_queue = add_messages_to_queue
    original_init = inmemory_grid.InMemoryGrid.__init__

    def grid_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.pull_interval = interval_s

    inmemory_grid.InMemoryGrid.__init__ = grid_init


# --------------------------------------------------------------------------------------------------
# the contender for harness.run_interleaved: start(), run_round(r), close(), info()


class FlowerContender:
    """Flower's Simulation Engine, driven round by round through :class:`Barrier`."""

    def __init__(self, name: str, bench: wl.Bench, model: str, data_path: Path, cpus: int, idle_s: float) -> None:
        self.name, self.bench, self.model, self.data_path, self.cpus, self.idle_s = (
            name,
            bench,
            model,
            data_path,
            cpus,
            idle_s,
        )
        self.barrier = Barrier(bench.total_rounds)
        self.times: dict[str, float] = {}
        self.final: ArrayRecord | None = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.timeline: list[dict[str, Any]] = []

    # -- the ServerApp --
    def _server_app(self) -> ServerApp:
        app = ServerApp()
        bench, barrier = self.bench, self.barrier

        @app.main()
        def main(grid: Grid, context: Context) -> None:
            strategy = SameClientsFedAvg(bench, barrier)
            config = ConfigRecord(
                {
                    "lr": bench.lr,
                    "epochs": bench.epochs,
                    "batch-size": bench.batch_size,
                    "model": self.model,
                    "data-path": str(self.data_path),
                }
            )
            strategy.start(
                grid=grid,
                initial_arrays=ArrayRecord(bench.init_model().state_dict()),
                num_rounds=bench.total_rounds,
                train_config=config,
                evaluate_fn=barrier.evaluate_fn,
            )

        return app

    def _run(self) -> None:
        try:
            run_simulation(
                server_app=self._server_app(),
                client_app=client_app,
                num_supernodes=len(self.bench.client_indices),
                backend_config={
                    "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                    "init_args": {"num_cpus": self.cpus, "include_dashboard": False},
                },
            )
        except BaseException as error:  # noqa: BLE001 - reported by the driver thread
            self.error = error

    def start(self) -> None:
        """Start the engine (Ray, 2 actors, 100 virtual nodes) and the ServerApp; return when round 1 can start.

        Ready means: the ServerApp has reached ``FedAvg.start``'s first ``evaluate_fn`` call, Ray is up and
        the actor processes answer (``__ray_ready__``; a hook around ``RayBackend.build`` waits for it,
        because Ray creates actors asynchronously). Imports inside the actors (torch, this module) and the
        first data load happen on their first message, i.e. in the warm-up round, as Flower does it."""
        actors_ready = threading.Event()
        original_build = raybackend.RayBackend.build
        times = self.times

        def build_and_wait(backend: Any, app_fn: Any) -> None:
            times["ray_initialised_s"] = time.perf_counter() - t0
            original_build(backend, app_fn)
            ray.get([actor.__ray_ready__.remote() for actor in list(backend.pool.pool)])
            times["actors_ready_s"] = time.perf_counter() - t0
            times["num_actors"] = backend.pool.num_actors
            actors_ready.set()

        raybackend.RayBackend.build = build_and_wait
        t0 = time.perf_counter()
        self.thread = threading.Thread(target=self._run, name=f"flower-{self.model}", daemon=True)
        self.thread.start()
        try:
            self._await(lambda: self.barrier.done.get(timeout=0.5))  # round 0: the ServerApp is in FedAvg.start
            times["serverapp_ready_s"] = time.perf_counter() - t0
            while not actors_ready.wait(0.5):
                self._check_alive()
        finally:
            raybackend.RayBackend.build = original_build
        self.times["startup_s"] = time.perf_counter() - t0
        # what the idle engine costs (its node poller, Ray's daemons, idle actors) while fedsim's rounds run
        meter = harness.Meter()
        time.sleep(self.idle_s)
        wall, _ = meter.stop()
        self.times["idle_cores"] = meter.own_cpu_s / wall

    def _check_alive(self) -> None:
        if self.thread is not None and not self.thread.is_alive():
            raise RuntimeError(f"Flower's simulation ended early: {self.error!r}") from self.error

    def _await(self, get: Any) -> Any:
        while True:
            try:
                return get()
            except queue.Empty:
                self._check_alive()

    def run_round(self, round_num: int) -> None:
        t0 = time.time()
        self.barrier.go.put(round_num)
        done_round, arrays = self._await(lambda: self.barrier.done.get(timeout=0.5))
        t1 = time.time()
        assert done_round == round_num, (done_round, round_num)
        self.final, self.rounds_done = arrays, round_num
        by_actor: dict[float, list[tuple[float, float]]] = {}
        for m in self.barrier.replies.get(round_num, []):
            by_actor.setdefault(m["pid"], []).append((m["t-start"], m["t-end"]))
        self.timeline.append(split_round(t0, t1, by_actor))

    def close(self) -> None:
        if self.thread is None:
            return
        if self.thread.is_alive():  # let FedAvg.start return (after the last round) or abort it (cut short)
            self.barrier.go.put(self.rounds_done + 1 if self.rounds_done == self.bench.total_rounds else None)
        self.thread.join(timeout=120)
        if ray.is_initialized():  # the engine's backend shuts Ray down itself; this only covers a crash
            ray.shutdown()

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"flower_startup": dict(self.times), "startup_s": self.times.get("startup_s")}
        if self.final is not None:
            model = self.bench.model_factory()
            model.load_state_dict(self.final.to_torch_state_dict())
            out["params"] = flatten(model)
        rounds = [self.barrier.replies.get(r, []) for r in range(1, self.bench.total_rounds + 1)]
        out["train_loss_per_round"] = [
            sum(m["train_loss"] * m["num-examples"] for m in reps) / sum(m["num-examples"] for m in reps)
            if reps
            else None
            for reps in rounds
        ]
        out["client_s_per_round"] = {  # summed over the round's 10 clients, measured inside the ClientApp
            key: [sum(m[key] for m in reps) for reps in rounds] for key in ("t-load-s", "t-train-s", "t-pack-s")
        }
        out["client_torch_threads"] = sorted({m["torch-threads"] for reps in rounds for m in reps})
        out["client_actor_pids"] = len({m["pid"] for reps in rounds for m in reps})
        out["client_ids_per_round"] = [[int(m["client-id"]) for m in reps] for reps in rounds]
        out["timeline"] = self.timeline
        return out
