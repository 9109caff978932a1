"""fedsim vs Flower's simulation engine on one workload: same data, same sampled clients, rounds interleaved.

One invocation trains the workload of ``bench_executors.py`` (synthetic MNIST-shaped data, 100 IID
clients, 10 sampled per round, E=1, B=10, SGD lr 0.01, FedAvg; McMahan CNN and 2NN) with:

* ``process_w2``  fedsim ``Server`` + ``ProcessExecutor(devices="cpu", workers=2, threads=1)``
* ``serial_t1``   fedsim ``Server`` + ``SerialExecutor(threads=1)``
* ``flower``      Flower's Simulation Engine (Ray backend) with 2 concurrent virtual clients:
                  ``run_simulation(ServerApp, ClientApp, num_supernodes=100)`` with
                  ``client_resources={"num_cpus": 1}`` on a 2-CPU Ray, a Message-API ``ServerApp``
                  running ``flwr.serverapp.strategy.FedAvg.start`` (``configure_train`` overridden only
                  to pick fedsim's sampled clients), and a ``ClientApp`` whose ``@app.train()`` runs the
                  same plain PyTorch loop as fedsim's ``Client`` (``torch.set_num_threads(1)``).

Flower runs inside this process (``run_simulation`` starts its ServerApp in a thread and the
engine, Ray included, in another), so its rounds can be interleaved with fedsim's by the driver of
``bench_executors.py``: ``FedAvg.start`` calls ``evaluate_fn`` once before round 1 and once after every
round; ours reports "round r done" to the driver and then blocks until the driver starts round
r + 1. A Flower round, as timed, is therefore exactly one iteration of ``Strategy.start``'s loop:
``configure_train`` → ``grid.send_and_receive`` (messages through the in-memory SuperLink state to the
Ray actors and back) → ``aggregate_train`` → the (empty) evaluation stage → ``evaluate_fn``.

Why ``run_simulation`` and not ``flwr run``: Flower 1.42 marks ``run_simulation`` deprecated in favour
of the ``flwr run`` CLI, which starts a local SuperLink daemon that launches a ``flwr-simulation``
process, which calls the same ``_run_simulation`` (same in-memory grid, same engine, same Ray backend).
Only the in-process entry point lets one driver interleave Flower's rounds with fedsim's on the same
in-memory data and count Ray's processes as this script's own CPU. So the per-round path measured here is
the one ``flwr run`` executes; its start-up (CLI, SuperLink, app bundle, subprocess) is not measured.

Everything else (the workload, the quiet-second wait before each round, wall time, the CPU of this
script's process tree, the cores used by OTHER processes) is imported from ``bench_executors.py``. The
fedsim contenders use ``diagnose_overhead.TimedClient`` (a plain ``Client`` that stamps the start and end
of ``fit``) and the Flower client stamps its own start and end, so every round is also split into
head (round start to first client), tail (last client to round end), idle gaps between clients on a
worker or actor, and time inside the clients. ``--flower-poll-s`` is a diagnostic that changes Flower's
two 0.1 s polling intervals (see ``set_flower_polling``).
This script needs Flower, which is not a fedsim dependency: run it in its own virtual environment
(see experiments/bench/README.md, "fedsim vs Flower")::

    /work/flower-venv/bin/python experiments/bench/bench_flower.py      # both models, ~5 min on 2 cores
    /work/flower-venv/bin/python experiments/bench/bench_flower.py --models 2nn --rounds-2nn 5
"""

from __future__ import annotations

import os

# before flwr and ray are imported: no telemetry, no update checks, no usage stats (and no network here)
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import queue  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from importlib.metadata import version  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg  # noqa: E402
from flwr.server.superlink.fleet.vce.backend import raybackend  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_executors as be  # noqa: E402  (the workload, the interleaved driver and the meters)
from diagnose_overhead import TimedClient  # noqa: E402  (a plain Client that stamps the start and end of fit)

from fedsim import FedAvg, SerialExecutor, Server, TensorData  # noqa: E402
from fedsim.client import evaluate_indices  # noqa: E402
from fedsim.data.partition import iid  # noqa: E402
from fedsim.executor import ProcessExecutor  # noqa: E402
from fedsim.params import flatten, load_flat  # noqa: E402
from fedsim.seeding import task_seed  # noqa: E402
from fedsim.types import ClientUpdate  # noqa: E402

CONTENDERS = ("process_w2", "serial_t1", "flower")


# --------------------------------------------------------------------------------------------------
# the Flower ClientApp. Ray actors import it from this module by name (``bench_flower.client_app``),
# so it must live in an importable module, not in ``__main__`` (see the bottom of this file).

client_app = ClientApp()
_ACTOR_DATA: dict[str, Any] = {}  # per actor process: the training data, loaded once (as Flower's tutorials cache their dataset)


def _actor_data(path: str) -> dict[str, Any]:
    """The training set and the client partition, memory-mapped from the file the driver wrote."""
    if _ACTOR_DATA.get("path") != path:
        blob = torch.load(path, mmap=True, weights_only=True)
        _ACTOR_DATA.clear()
        _ACTOR_DATA.update(path=path, x=blob["x"], y=blob["y"], shares=blob["shares"])
    return _ACTOR_DATA


def local_sgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, indices: torch.Tensor, *, epochs: int,
              batch_size: int, lr: float, seed: int) -> float:
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
    model = be.MODELS[str(config["model"])](input_shape=be.INPUT_SHAPE, num_classes=be.NUM_CLASSES)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    t1 = time.perf_counter()
    indices = data["shares"][int(config["client-id"])]
    loss = local_sgd(model, data["x"], data["y"], indices, epochs=int(config["epochs"]), batch_size=int(config["batch-size"]),
                     lr=float(config["lr"]), seed=int(config["task-seed"]))
    t2 = time.perf_counter()
    arrays = ArrayRecord(model.state_dict())
    t3 = time.perf_counter()
    metrics = MetricRecord({
        "train_loss": loss, "num-examples": len(indices), "client-id": int(config["client-id"]),
        "t-load-s": t1 - t0, "t-train-s": t2 - t1, "t-pack-s": t3 - t2, "torch-threads": torch.get_num_threads(),
        "pid": os.getpid(), "t-start": wall_start, "t-end": time.time(),
    })
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

    def __init__(self, bench: be.Bench, barrier: Barrier) -> None:
        n = len(bench.client_indices)
        super().__init__(fraction_train=bench.per_round / n, fraction_evaluate=0.0, min_train_nodes=bench.per_round,
                         min_evaluate_nodes=0, min_available_nodes=n)
        self.bench, self.barrier = bench, barrier

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> list[Message]:
        while len(node_ids := sorted(grid.get_node_ids())) < len(self.bench.client_indices):
            time.sleep(0.1)
        messages = []
        for cid in self.bench.sampled(server_round):
            cfg = ConfigRecord({**config, "server-round": server_round, "client-id": cid,
                                "task-seed": task_seed(self.bench.seed, server_round, cid)})
            content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: cfg})
            messages.append(Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node_ids[cid]))
        return messages

    def aggregate_train(self, server_round: int, replies: Any) -> Any:
        replies = list(replies)
        self.barrier.replies[server_round] = [
            {k: float(v) for k, v in msg.content["metrics"].items()} for msg in replies if not msg.has_error()
        ]
        return super().aggregate_train(server_round, replies)


def split_round(t0: float, t1: float, by_worker: dict[Any, list[tuple[float, float]]]) -> dict[str, float]:
    """Where a round's wall time went (wall clock; every process of this machine shares it): ``head`` from
    the round's start to the first client's start, ``tail`` from the last client's end to the round's end,
    ``gaps`` the summed idle time between two clients on the same worker/actor, ``busy`` the summed time
    inside the clients (fedsim: ``Client.fit``; Flower: the whole ``@app.train()`` function)."""
    starts = [s for iv in by_worker.values() for s, _ in iv]
    ends = [e for iv in by_worker.values() for _, e in iv]
    if not starts:
        return {"wall_s": t1 - t0}
    gaps = [b[0] - a[1] for iv in by_worker.values() for a, b in zip(sorted(iv), sorted(iv)[1:])]
    return {
        "wall_s": t1 - t0, "head_s": min(starts) - t0, "tail_s": t1 - max(ends),
        "gaps_s": sum(gaps), "max_gap_s": max(gaps, default=0.0), "num_gaps": len(gaps),
        "busy_s": sum(e - s for iv in by_worker.values() for s, e in iv), "workers": len(by_worker),
    }


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
            for node_id in nodes_mapping.keys():
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
# contenders for be.run_interleaved: start(), run_round(r), close(), info()


class FedsimRun(be.FedsimContender):
    """``bench_executors.FedsimContender`` with ``diagnose_overhead.TimedClient`` clients (a plain ``Client``
    that stamps the wall-clock start and end of its ``fit``); keeps each round's metrics and updates."""

    def __init__(self, name: str, bench: be.Bench, executor: Any, log_dir: Path) -> None:
        self.name, self.bench, self.executor, self.log_dir, self.parent_threads = name, bench, executor, log_dir, None
        optimizer = functools.partial(torch.optim.SGD, lr=bench.lr)
        self.clients = [TimedClient(i, idx, epochs=bench.epochs, batch_size=bench.batch_size, optimizer=optimizer)
                        for i, idx in enumerate(bench.client_indices)]
        self.server = Server(model_factory=bench.model_factory, clients=self.clients, train_data=bench.data, test_data=None,
                             strategy=FedAvg(), executor=executor, num_rounds=bench.total_rounds,
                             clients_per_round=bench.per_round, seed=bench.seed)
        self.metrics: list[dict[str, float]] = []
        self.timeline: list[dict[str, Any]] = []
        self.rounds_done = 0
        self._updates: list[Any] = []
        fit = executor.fit

        def fit_and_keep(global_params: torch.Tensor, tasks: Any) -> Any:
            results = fit(global_params, tasks)
            self._updates = [r for r in results if isinstance(r, ClientUpdate)]
            return results

        executor.fit = fit_and_keep

    def run_round(self, round_num: int) -> None:
        t0 = time.time()
        self.metrics.append(self.server.run_round(round_num))
        t1 = time.time()
        by_worker: dict[str, list[tuple[float, float]]] = {}
        for u in self._updates:
            by_worker.setdefault(u.worker, []).append((u.metrics["t_start"], u.metrics["t_end"]))
        self.timeline.append(split_round(t0, t1, by_worker))

    def info(self) -> dict[str, Any]:
        return {**super().info(), "train_loss_per_round": [m.get("train/loss") for m in self.metrics],
                "timeline": self.timeline}


class FlowerContender:
    """Flower's Simulation Engine, driven round by round through :class:`Barrier`."""

    def __init__(self, name: str, bench: be.Bench, model: str, data_path: Path, cpus: int, idle_s: float) -> None:
        self.name, self.bench, self.model, self.data_path, self.cpus, self.idle_s = name, bench, model, data_path, cpus, idle_s
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
            config = ConfigRecord({"lr": bench.lr, "epochs": bench.epochs, "batch-size": bench.batch_size,
                                   "model": self.model, "data-path": str(self.data_path)})
            strategy.start(grid=grid, initial_arrays=ArrayRecord(bench.init_model().state_dict()),
                           num_rounds=bench.total_rounds, train_config=config, evaluate_fn=barrier.evaluate_fn)

        return app

    def _run(self) -> None:
        try:
            run_simulation(
                server_app=self._server_app(), client_app=client_app, num_supernodes=len(self.bench.client_indices),
                backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                "init_args": {"num_cpus": self.cpus, "include_dashboard": False}},
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
        meter = be.Meter()
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
            sum(m["train_loss"] * m["num-examples"] for m in reps) / sum(m["num-examples"] for m in reps) if reps else None
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


# --------------------------------------------------------------------------------------------------
# checks that every contender really trained, and report


def held_out(num_train: int, num_test: int, seed: int) -> TensorData:
    """``num_test`` fresh examples labelled by the same random teacher as ``be.mnist_shaped(num_train, seed)``:
    the same generator stream, continued after the teacher (the training set itself is not touched)."""
    gen = torch.Generator().manual_seed(seed)
    torch.rand((num_train, *be.INPUT_SHAPE), generator=gen)  # the training images, skipped
    teacher = torch.randn(math.prod(be.INPUT_SHAPE), be.NUM_CLASSES, generator=gen)
    x = torch.rand((num_test, *be.INPUT_SHAPE), generator=gen)
    y = ((x.reshape(num_test, -1) - 0.5) @ teacher).argmax(dim=1)
    return TensorData(x, y, be.NUM_CLASSES)


def evaluate_flat(bench: be.Bench, flat: torch.Tensor, test: TensorData) -> dict[str, float]:
    model = bench.model_factory()
    load_flat(model, flat)
    with torch.no_grad():
        result = evaluate_indices(model, test)
    return {"test_loss": result["loss"], "test_accuracy": result["accuracy"]}


def pairs(num: list[float], den: list[float]) -> list[float]:
    return [a / b for a, b in zip(num, den)]


def compare(rows: dict[str, dict[str, Any]], results: dict[str, dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Ratios of medians, per-round ratios (rounds that ran back to back), the quiet ones, CPU ratios."""
    out: dict[str, Any] = {}
    for a, b in (("flower", "process_w2"), ("flower", "serial_t1"), ("serial_t1", "process_w2")):
        if a not in rows or b not in rows:
            continue
        per_round = pairs(rows[a]["timed_round_s"], rows[b]["timed_round_s"])
        loads = zip(results[a]["others_cores"][warmup:], results[b]["others_cores"][warmup:])
        quiet = [r for r, load in zip(per_round, loads) if max(load) < be.QUIET["threshold_cores"]]
        cpu = pairs(results[a]["own_cpu_s"][warmup:], results[b]["own_cpu_s"][warmup:])
        out[f"{a}/{b}"] = {
            "medians": rows[a]["median_round_s"] / rows[b]["median_round_s"],
            "per_round": per_round, "per_round_median": statistics.median(per_round),
            "quiet_pairs": quiet, "quiet_pairs_median": statistics.median(quiet) if quiet else None,
            "cpu_per_round_median": statistics.median(cpu),
            "startup": rows[a]["startup_s"] / rows[b]["startup_s"] if rows[b]["startup_s"] > 0.05 else None,
        }
    return out


def report_model(model: str, bench: be.Bench, rows: dict[str, Any], results: dict[str, Any], cmp: dict[str, Any],
                 test: TensorData) -> dict[str, Any]:
    init = bench.init_model()
    quality: dict[str, Any] = {"initial": evaluate_flat(bench, flatten(init), test)}
    for name, res in results.items():
        if "params" in res:
            quality[name] = evaluate_flat(bench, res["params"], test)
    ref = results.get("serial_t1", {}).get("params")
    diffs = {}
    for name in ("process_w2", "flower"):
        if ref is not None and "params" in results.get(name, {}):
            delta = (results[name]["params"] - ref).abs()
            diffs[f"{name} vs serial_t1"] = {"bitwise_equal": bool(torch.equal(results[name]["params"], ref)),
                                            "max_abs_diff": float(delta.max()),
                                            "rel_l2_diff": float(delta.norm() / ref.norm())}
    for name, row in rows.items():
        row["warmup_round_s"] = results[name]["round_s"][: bench.warmup]
        row["startup_plus_warmup_s"] = row["startup_s"] + sum(row["warmup_round_s"])
        row["startup_plus_all_rounds_s"] = row["startup_s"] + sum(results[name]["round_s"])
        timed = row.get("timeline", [])[bench.warmup :]
        if timed and "head_s" in timed[0]:
            row["timeline_median"] = {k: statistics.median(t[k] for t in timed)
                                      for k in ("wall_s", "head_s", "tail_s", "gaps_s", "max_gap_s", "busy_s")}
    return {"contenders": rows, "comparison": cmp, "quality": quality, "final_weights": diffs,
            "num_params": sum(p.numel() for p in init.parameters())}


def print_model(model: str, out: dict[str, Any]) -> None:
    rows = out["contenders"]
    print(f"\n== {model} ({out['num_params']:,} parameters)")
    print(f"{'contender':<12}{'median s/round':>16}{'cpu s/round':>13}{'startup s':>11}{'warm-up s':>11}"
          f"{'others cores':>14}  timed rounds (s)")
    for name, row in rows.items():
        rounds = ", ".join(f"{s:.3f}" for s in row["timed_round_s"])
        print(f"{name:<12}{row['median_round_s']:>16.3f}{row['median_cpu_s']:>13.2f}{row['startup_s']:>11.2f}"
              f"{sum(row['warmup_round_s']):>11.2f}{row['max_others_cores']:>14.2f}  {rounds}")
    for key, c in out["comparison"].items():
        quiet = c["quiet_pairs_median"]
        print(f"{key}: {c['medians']:.2f}x (medians); per round {', '.join(f'{r:.2f}' for r in c['per_round'])}; "
              f"quiet pairs {len(c['quiet_pairs'])}, median {float('nan') if quiet is None else quiet:.2f}; "
              f"CPU {c['cpu_per_round_median']:.2f}x")
    for name, q in out["quality"].items():
        loss = rows.get(name, {}).get("train_loss_per_round")
        trace = "" if loss is None else "; train loss per round " + ", ".join(f"{v:.4f}" for v in loss)
        print(f"{name:<12} test loss {q['test_loss']:.4f}, accuracy {q['test_accuracy']:.4f}{trace}")
    for key, d in out["final_weights"].items():
        print(f"final weights {key}: bitwise {d['bitwise_equal']}, max |diff| {d['max_abs_diff']:.3g}, "
              f"relative L2 {d['rel_l2_diff']:.3g}")
    for name, row in rows.items():
        t = row.get("timeline_median")
        if t:
            print(f"{name:<12} timeline (median of timed rounds, s): wall {t['wall_s']:.3f} = head {t['head_s']:.3f} "
                  f"+ tail {t['tail_s']:.3f} + ...; idle gaps between clients {t['gaps_s']:.3f} (max {t['max_gap_s']:.3f}); "
                  f"time inside clients {t['busy_s']:.3f}")
    flower = rows.get("flower")
    if flower:
        print(f"flower start-up: {json.dumps(flower['flower_startup'])}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--models", default="2nn,cnn", help="comma-separated subset of: " + ",".join(be.MODELS))
    p.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated subset of: " + ",".join(CONTENDERS))
    p.add_argument("--num-examples", type=int, default=60_000)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--examples-per-client", type=int, default=None, help="default: all (600)")
    p.add_argument("--rounds", type=int, default=8, help="timed rounds per contender (CNN)")
    p.add_argument("--rounds-2nn", type=int, default=15, help="timed rounds per contender for the 2NN (short, noisy rounds)")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up rounds before them")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpus", type=int, default=2, help="CPUs given to Flower's Ray (1 per virtual client)")
    p.add_argument("--test-examples", type=int, default=10_000, help="held-out examples for the final accuracy")
    p.add_argument("--flower-poll-s", type=float, default=None,
                   help="DIAGNOSTIC: poll interval of Flower's engine instead of its built-in 0.1 s (see set_flower_polling)")
    p.add_argument("--idle-s", type=float, default=5.0, help="seconds to measure Flower's idle CPU after start-up")
    p.add_argument("--quiet-threshold", type=float, default=0.25)
    p.add_argument("--quiet-wait", type=float, default=5.0)
    p.add_argument("--out", type=Path, default=be.HERE / "results_flower.json")
    return p.parse_args(argv)


def make_contender(name: str, bench: be.Bench, model: str, data_path: Path, args: argparse.Namespace, tmp: Path) -> Any:
    if name == "process_w2":
        return FedsimRun(name, bench, ProcessExecutor(devices="cpu", workers=2, threads=1), tmp / model / name)
    if name == "serial_t1":
        return FedsimRun(name, bench, SerialExecutor(threads=1), tmp / model / name)
    if name == "flower":
        return FlowerContender(name, bench, model, data_path, args.cpus, args.idle_s)
    raise ValueError(f"unknown contender {name}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    be.QUIET.update(threshold_cores=args.quiet_threshold, max_wait_s=args.quiet_wait)
    data = be.mnist_shaped(args.num_examples, args.seed)
    shares = iid(data.labels, num_clients=args.clients, seed=args.seed)
    if args.examples_per_client is not None:
        shares = [s[: args.examples_per_client] for s in shares]
    args.examples_per_client = args.examples_per_client or int(statistics.median(len(s) for s in shares))
    test = held_out(args.num_examples, args.test_examples, args.seed)
    if args.flower_poll_s is not None:
        set_flower_polling(args.flower_poll_s)
    report: dict[str, Any] = {
        "machine": {**be.machine(), "flwr": version("flwr"), "ray": ray.__version__, "numpy": np.__version__},
        "code": be.code_version(), "flower_api": "flwr.simulation.run_simulation (deprecated in flwr 1.42: its warning says to use "
        "`flwr run`) + Message API ServerApp/ClientApp + flwr.serverapp.strategy.FedAvg.start",
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "models": {},
    }
    print(json.dumps(report["machine"]))
    with tempfile.TemporaryDirectory(prefix="fedsim-bench-flower-") as tmp:
        data_path = Path(tmp) / "train.pt"  # what Flower's ClientApps load (memory-mapped), written once, not timed
        torch.save({"x": data.x, "y": data.y, "shares": [torch.from_numpy(s) for s in shares]}, data_path)
        for model in args.models.split(","):
            rounds = args.rounds_2nn if model == "2nn" else args.rounds
            bench = be.make_bench(model, data, shares, argparse.Namespace(**{**vars(args), "rounds": rounds}))
            contenders = [make_contender(n, bench, model, data_path, args, Path(tmp)) for n in args.contenders.split(",")]
            results = be.run_interleaved(bench, contenders)
            rows = {k: be.summarize(v, args.warmup) for k, v in results.items()}
            out = report_model(model, bench, rows, results, compare(rows, results, args.warmup), test)
            print_model(model, out)
            report["models"][model] = out
            args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")  # after each model
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    # Run as a script, this file is ``__main__``; import it under its own name so that the ClientApp
    # and everything it uses are pickled by reference (``bench_flower.client_app``), not by value.
    import bench_flower

    bench_flower.main()
