"""Side-by-side benchmark of fedsim's executors against a naive process-pool recipe and a centralized bound.

One invocation trains the same federated workload (synthetic MNIST-shaped data, 100 IID clients,
10 sampled per round, epochs=1, batch_size=10, SGD lr=0.01) with every contender, on every model
(McMahan CNN and 2NN), and prints one table plus the target ratios. Everything is seeded.

Contenders (per model):

* ``serial_t1`` / ``serial_t2``     fedsim ``Server`` + ``SerialExecutor(threads=1 / 2)``
* ``process_w1`` / ``process_w2``   fedsim ``Server`` + ``ProcessExecutor(devices="cpu", workers=1 / 2, threads=1)``
* ``process_w1_pt1`` / ``process_w2_pt1``  the same, with the server process itself limited to 1 intra-op thread during
                                    each round (``torch.set_num_threads(1)`` around ``run_round``): not a fedsim
                                    setting, a measurement of the fix proposed in docs/performance.md
* ``naive_fork``                    the common recipe with the default start method (``fork`` on Linux): a new
                                    ``ProcessPoolExecutor(2)`` per round, each task pickles a user object
                                    (its own ``nn.Module`` + ``DataLoader``), ``user.train()`` returns
                                    ``state_dict()``, the parent ``load_state_dict``s and averages. Run with a
                                    short timeout: after the parent has used torch's OpenMP threads it deadlocks.
* ``naive_spawn``                   the same recipe with ``mp_context=spawn`` (the usual fix); workers keep torch's
                                    default thread count, so 2 workers x 2 threads oversubscribe 2 cores
* ``naive_fork_t1``                 the same recipe with ``fork`` after ``torch.set_num_threads(1)`` in the parent
                                    (the other fix: no deadlock, children inherit 1 thread, no oversubscription)
* ``central_t1`` / ``central_t2``   lower bound: one process, one model, the union of the round's sampled clients'
                                    examples, the same number of SGD steps of the same batch size, 1 / 2 threads
* ``process_g1`` / ``_g2`` / ``_g4``  ``ProcessExecutor(devices=[--device], workers_per_device=1 / 2 / 4, threads=1)``:
                                    the GPU contenders (they run on ``--device cpu`` too, as CPU workers)

``--device cuda`` (or ``cuda:N``) trains on that GPU: ``serial_t*`` is ``SerialExecutor(device=..., threads=*)``,
``central_t*`` trains there with the data copied there once, and the default contenders become
``serial_t1,process_g1,process_g2,process_g4,central_t1``; the CPU-only contenders (``process_w*``, ``naive_*``)
are refused. Every round ends synchronised (fedsim's executors return CPU tensors; ``central_t*`` reads
its summed loss after its last step), and the driver also calls ``torch.cuda.synchronize(device)`` after
each round of a contender that trains on a GPU from this process, as a safeguard. The results JSON gets a
``device`` entry (name, capability, memory, CUDA version, TF32 settings) and GPU ratios instead of the
CPU targets; that GPU report is also what a CPU run with a ``process_g*`` contender prints.

Rounds are interleaved: every contender is started, then round r of each runs in turn (the order
rotating every round), so all of them meet the same stretch of background load; each round starts
after a quiet second when one comes within ``--quiet-wait`` seconds. Per round the script records
the wall time, the CPU seconds of its own processes and how many cores OTHER processes used meanwhile
(from /proc/stat), so a noisy measurement is visible as such. Benchmarks are measurements, not tests:
nothing here asserts a time.

Run from the repository root::

    .venv/bin/python experiments/bench/bench_executors.py     # both models, full workload: ~15-25 min on 2 cores
    .venv/bin/python experiments/bench/bench_executors.py --examples-per-client 300   # about half that
    .venv/bin/python experiments/bench/bench_executors.py --models 2nn --rounds 5
    .venv/bin/python experiments/bench/bench_executors.py --device cuda --models 2nn   # on a GPU
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import functools
import json
import math
import multiprocessing as mp
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fedsim import Client, FedAvg, SerialExecutor, Server, TensorData
from fedsim.data.partition import iid
from fedsim.executor import Executor, ProcessExecutor, Workload
from fedsim.executor.placement import physical_cores
from fedsim.models import MLP2NN, McMahanCNN
from fedsim.seeding import init_seed, sampling_rng, task_seed

MODELS: dict[str, type[nn.Module]] = {"cnn": McMahanCNN, "2nn": MLP2NN}
INPUT_SHAPE, NUM_CLASSES = (1, 28, 28), 10
CONTENDERS = (
    "serial_t1", "serial_t2", "process_w1", "process_w2", "process_w1_pt1", "process_w2_pt1",
    "naive_fork", "naive_spawn", "naive_fork_t1", "central_t1", "central_t2",
)
GPU_CONTENDERS = ("process_g1", "process_g2", "process_g4")  # ProcessExecutor on --device (any device)
GPU_DEFAULT = ("serial_t1", "process_g1", "process_g2", "process_g4", "central_t1")
CPU_ONLY = ("process_w1", "process_w2", "process_w1_pt1", "process_w2_pt1", "naive_fork", "naive_spawn", "naive_fork_t1")
HERE = Path(__file__).resolve().parent


# --------------------------------------------------------------------------------------------------
# workload


def mnist_shaped(num_examples: int, seed: int) -> TensorData:
    """``num_examples`` random 1x28x28 float32 images in [0, 1) with labels from a random linear teacher.

    Made once from a seeded ``torch.Generator``: fixed, learnable (the labels are a function of the
    pixels) and downloaded from nowhere.
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand((num_examples, *INPUT_SHAPE), generator=gen)
    teacher = torch.randn(math.prod(INPUT_SHAPE), NUM_CLASSES, generator=gen)
    y = ((x.reshape(num_examples, -1) - 0.5) @ teacher).argmax(dim=1)
    return TensorData(x, y, NUM_CLASSES)


@dataclass(frozen=True)
class Bench:
    """One model's workload, shared by every contender."""

    name: str
    model_factory: Callable[[], nn.Module]
    data: TensorData
    client_indices: list[np.ndarray]
    per_round: int
    warmup: int
    rounds: int
    epochs: int
    batch_size: int
    lr: float
    seed: int

    @property
    def total_rounds(self) -> int:
        return self.warmup + self.rounds

    def sampled(self, round_num: int) -> list[int]:
        """The clients of ``round_num``: the very ids fedsim's Server samples (same strategy, same rng)."""
        rng = sampling_rng(self.seed, round_num)
        return FedAvg().sample(round_num, len(self.client_indices), self.per_round, rng)

    def init_model(self) -> nn.Module:
        """The initial global model, built exactly as ``Server.__init__`` builds it."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed(self.seed))
            return self.model_factory()

    def steps(self, client_ids: list[int]) -> int:
        """Local SGD steps of these clients in one round (what fedsim's Client runs)."""
        return sum(self.epochs * math.ceil(len(self.client_indices[c]) / self.batch_size) for c in client_ids)


# --------------------------------------------------------------------------------------------------
# how busy the machine is with other people's work (these benchmark machines are shared and noisy)

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (user+nice+system+irq+softirq+steal), from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields[i] for i in (0, 1, 2, 5, 6, 7)) / CLOCK_TICKS


def own_cpu_s() -> float:
    """CPU seconds of this process and all its descendants, alive (from /proc) or reaped (rusage)."""
    parent_of, cpu_of = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            rest = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parent_of[int(entry)], cpu_of[int(entry)] = int(rest[1]), (int(rest[11]) + int(rest[12])) / CLOCK_TICKS
    me, mine = os.getpid(), {os.getpid()}
    changed = True
    while changed:
        grown = {pid for pid, ppid in parent_of.items() if ppid in mine} | mine
        changed, mine = grown != mine, grown
    live_children = sum(cpu_of.get(pid, 0.0) for pid in mine if pid != me)
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime + live_children


class Meter:
    """Wall time of an interval and the cores that processes other than ours kept busy during it."""

    def __init__(self) -> None:
        self.wall, self.busy, self.own = time.perf_counter(), machine_busy_s(), own_cpu_s()

    def stop(self) -> tuple[float, float]:
        """Wall seconds and others' mean busy cores; sets ``own_cpu_s`` (our process tree's CPU seconds)."""
        wall = time.perf_counter() - self.wall
        self.own_cpu_s = own_cpu_s() - self.own
        foreign = (machine_busy_s() - self.busy) - self.own_cpu_s
        return wall, max(foreign, 0.0) / max(wall, 1e-9)


QUIET = {"threshold_cores": 0.25, "max_wait_s": 5.0}


def wait_for_quiet() -> float:
    """Wait (at most ``QUIET['max_wait_s']``) for a 1 s window in which others use < threshold cores.

    Returns the others' load in the last window (so a round started on a busy machine is visible).
    """
    deadline = time.monotonic() + QUIET["max_wait_s"]
    while True:
        meter = Meter()
        time.sleep(1.0)
        _, foreign = meter.stop()
        if foreign < QUIET["threshold_cores"] or time.monotonic() > deadline:
            return foreign


# --------------------------------------------------------------------------------------------------
# contenders: start() once, run_round(r) per round, close(); the driver interleaves their rounds


class FedsimContender:
    """fedsim's Server + an executor, driven as ``Server.run`` drives it (start, run_round..., close)."""

    def __init__(self, name: str, bench: Bench, executor: Executor, log_dir: Path, parent_threads: int | None = None) -> None:
        self.name, self.bench, self.executor, self.log_dir = name, bench, executor, log_dir
        self.parent_threads = parent_threads
        optimizer = functools.partial(torch.optim.SGD, lr=bench.lr)
        self.clients = [
            Client(i, idx, epochs=bench.epochs, batch_size=bench.batch_size, optimizer=optimizer)
            for i, idx in enumerate(bench.client_indices)
        ]
        self.server = Server(
            model_factory=bench.model_factory, clients=self.clients, train_data=bench.data, test_data=None,
            strategy=FedAvg(), executor=executor, num_rounds=bench.total_rounds,
            clients_per_round=bench.per_round, seed=bench.seed,
        )

    def start(self) -> None:
        self.executor.start(Workload(self.bench.model_factory, self.clients, self.bench.data, log_dir=self.log_dir))

    def run_round(self, round_num: int) -> None:
        previous = torch.get_num_threads()
        if self.parent_threads is not None:  # the server process's own intra-op threads (see *_pt1)
            torch.set_num_threads(self.parent_threads)
        try:
            self.server.run_round(round_num)
        finally:
            torch.set_num_threads(previous)

    def close(self) -> None:
        self.executor.close()

    def info(self) -> dict[str, Any]:
        return {"params": self.server.params.clone()}


# the naive recipe, written as users commonly write it


class User:
    """A user object of the naive recipe: its own model and a DataLoader over its own data."""

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int, epochs: int, lr: float) -> None:
        self.model, self.epochs, self.lr = model, epochs, lr
        self.loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, generator=torch.Generator())
        self.seed = 0

    def train(self) -> dict[str, torch.Tensor]:
        self.loader.generator.manual_seed(self.seed)  # seeded per (run, round, user) by the parent
        optimizer = torch.optim.SGD(self.model.parameters(), lr=self.lr)
        self.model.train()
        for _ in range(self.epochs):
            for x, y in self.loader:
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(self.model(x), y)
                loss.backward()
                optimizer.step()
        return self.model.state_dict()


def child_threads() -> int:
    """Intra-op threads a pool worker trains with (probed once per variant, outside the timing)."""
    return torch.get_num_threads()


class Deadlock(RuntimeError):
    """A pool's first result did not arrive in time."""


def kill_pool(pool: cf.ProcessPoolExecutor) -> None:
    """SIGKILL the worker processes this pool started (by pid) and abandon the pool."""
    for pid in list(getattr(pool, "_processes", {}) or {}):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    pool.shutdown(wait=False, cancel_futures=True)


def pool_map(ctx: mp.context.BaseContext, workers: int, calls: list[Callable[[], Any]], first_timeout: float) -> list[Any]:
    """A NEW process pool, one task per call, results in submission order; raise Deadlock on a stall."""
    pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
    futures = [pool.submit(call) for call in calls]
    try:
        first = futures[0].result(timeout=first_timeout)
    except cf.TimeoutError:
        kill_pool(pool)
        raise Deadlock(f"no result after {first_timeout:g} s") from None
    results = [first] + [f.result() for f in futures[1:]]
    pool.shutdown(wait=True)
    return results


def fedavg_states(states: list[dict[str, torch.Tensor]], weights: list[int]) -> dict[str, torch.Tensor]:
    total = float(sum(weights))
    return {k: sum(s[k] * (w / total) for s, w in zip(states, weights)) for k in states[0]}


class NaiveContender:
    """The naive recipe: users built once, a NEW pool per round, user objects pickled per task,
    ``state_dict()`` back, ``load_state_dict`` + FedAvg in the parent."""

    def __init__(self, name: str, bench: Bench, start_method: str, parent_threads: int | None, first_timeout: float) -> None:
        self.name, self.bench, self.ctx = name, bench, mp.get_context(start_method)
        self.parent_threads, self.first_timeout = parent_threads, first_timeout
        self.threads: int | None = None

    def _threads(self) -> int:
        return self.parent_threads or torch.get_num_threads()

    def start(self) -> None:
        self.global_model = self.bench.init_model()
        b = self.bench
        self.users = [
            User(b.model_factory(), b.data.x[idx], b.data.y[idx], batch_size=b.batch_size, epochs=b.epochs, lr=b.lr)
            for idx in b.client_indices
        ]
        previous = torch.get_num_threads()
        torch.set_num_threads(self._threads())
        try:
            self.threads = pool_map(self.ctx, 1, [child_threads], self.first_timeout)[0]
        finally:
            torch.set_num_threads(previous)

    def run_round(self, round_num: int) -> None:
        previous = torch.get_num_threads()
        torch.set_num_threads(self._threads())
        try:
            ids = self.bench.sampled(round_num)
            state = self.global_model.state_dict()
            for cid in ids:
                self.users[cid].model.load_state_dict(state)
                self.users[cid].seed = task_seed(self.bench.seed, round_num, cid)
            states = pool_map(self.ctx, 2, [self.users[cid].train for cid in ids], self.first_timeout)
            for cid, user_state in zip(ids, states):
                self.users[cid].model.load_state_dict(user_state)
            sizes = [len(self.users[c].loader.dataset) for c in ids]
            self.global_model.load_state_dict(fedavg_states(states, sizes))
        finally:
            torch.set_num_threads(previous)

    def close(self) -> None:
        self.users = []

    def info(self) -> dict[str, Any]:
        return {"child_threads": self.threads, "start_method": self.ctx.get_start_method()}


# centralized lower bound


class CentralContender:
    """One model, the union of each round's sampled clients' examples, the same steps and batch size.

    On a GPU ``device`` the training data is copied there once, here (not timed), and the model lives there;
    each pass's batch order is moved there once and the losses are summed there and read once per round,
    as fedsim's ``Client`` does per epoch (``read_every_loss``, the CPU behaviour, reads each one).
    """

    def __init__(self, name: str, bench: Bench, threads: int, device: str = "cpu") -> None:
        if device != "cpu":
            data = TensorData(bench.data.x.to(device), bench.data.y.to(device), bench.data.num_classes)
            bench = replace(bench, data=data)
        self.name, self.bench, self.threads, self.device = name, bench, threads, device
        self.read_every_loss = device == "cpu"
        self.steps_done: list[int] = []

    def start(self) -> None:
        self.model = self.bench.init_model().to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=self.bench.lr)
        self.model.train()

    def run_round(self, round_num: int) -> None:
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            self._train(round_num)
        finally:
            torch.set_num_threads(previous)

    def _train(self, round_num: int) -> None:
        b = self.bench
        ids = b.sampled(round_num)
        union = torch.from_numpy(np.concatenate([b.client_indices[c] for c in ids]))
        gen = torch.Generator().manual_seed(b.seed * 100_003 + round_num)
        steps, done = b.steps(ids), 0
        total = torch.zeros((), dtype=torch.float64, device=b.data.x.device)
        while done < steps:
            order = union[torch.randperm(len(union), generator=gen)].to(b.data.x.device)
            for start in range(0, len(order), b.batch_size):
                if done == steps:
                    break
                idx = order[start : start + b.batch_size]
                x, y = b.data.x[idx], b.data.y[idx]
                self.optimizer.zero_grad(set_to_none=True)
                loss = nn.functional.cross_entropy(self.model(x), y)
                loss.backward()
                self.optimizer.step()
                if self.read_every_loss:
                    float(loss.detach())  # the loss is read (on a CPU this costs what fedsim's tensor sum costs)
                else:
                    total += loss.detach().double()  # a GPU is waited for once per round, not once per step
                done += 1
        float(total)
        self.steps_done.append(done)

    def close(self) -> None:
        pass

    def info(self) -> dict[str, Any]:
        return {"steps_per_round": self.steps_done}


Contender = FedsimContender | NaiveContender | CentralContender


def make_contender(name: str, bench: Bench, args: argparse.Namespace, log_dir: Path) -> Contender:
    """The contender called ``name``, training on ``args.device`` where it has a device."""
    device = getattr(args, "device", "cpu")
    if name.startswith("serial_t"):
        return FedsimContender(name, bench, SerialExecutor(device=device, threads=int(name[-1])), log_dir / name)
    if name.startswith("process_g"):
        executor = ProcessExecutor(devices=[device], workers_per_device=int(name[len("process_g"):]), threads=1)
        return FedsimContender(name, bench, executor, log_dir / name)
    if name.startswith("process_w"):
        workers, parent_threads = int(name[len("process_w")]), (1 if name.endswith("_pt1") else None)
        executor = ProcessExecutor(devices="cpu", workers=workers, threads=1)
        return FedsimContender(name, bench, executor, log_dir / name, parent_threads=parent_threads)
    if name == "naive_fork":
        return NaiveContender(name, bench, "fork", None, args.fork_timeout)
    if name == "naive_spawn":
        return NaiveContender(name, bench, "spawn", None, args.naive_timeout)
    if name == "naive_fork_t1":
        return NaiveContender(name, bench, "fork", 1, args.naive_timeout)
    if name.startswith("central_t"):
        return CentralContender(name, bench, int(name[-1]), device)
    raise ValueError(f"unknown contender {name}")


def run_interleaved(bench: Bench, contenders: list[Contender]) -> dict[str, dict[str, Any]]:
    """Start every contender, then run round r of each one after the other (the order rotating every
    round), so that all of them see the same stretch of background load; then close them all."""
    rows: dict[str, dict[str, Any]] = {
        c.name: {"round_s": [], "own_cpu_s": [], "others_cores": [], "others_cores_before": []} for c in contenders
    }
    alive = list(contenders)
    try:
        for c in contenders:
            wait_for_quiet()
            start = time.perf_counter()
            c.start()
            rows[c.name]["startup_s"] = time.perf_counter() - start
        for round_num in range(1, bench.total_rounds + 1):
            shift = (round_num - 1) % len(alive)
            for c in alive[shift:] + alive[:shift]:
                print(f"[{bench.name}] round {round_num} {c.name}", file=sys.stderr, flush=True)
                row = rows[c.name]
                row["others_cores_before"].append(wait_for_quiet())
                meter = Meter()
                try:
                    c.run_round(round_num)
                except Deadlock as error:
                    row.update(deadlocked=True, error=f"round {round_num}: deadlock ({error}); pool killed")
                    alive.remove(c)
                    continue
                synchronize_cuda(parent_devices(c))
                wall, foreign = meter.stop()
                row["round_s"].append(wall)
                row["own_cpu_s"].append(meter.own_cpu_s)
                row["others_cores"].append(foreign)
    finally:
        for c in contenders:
            c.close()
    for c in contenders:
        rows[c.name].update(c.info())
    return rows


def parent_devices(contender: Any) -> list[str]:
    """The devices that ``contender`` trains on from THIS process (process workers' devices are not ours)."""
    if hasattr(contender, "executor"):
        executor = contender.executor
        return [str(d) for d in getattr(executor, "devices", [getattr(executor, "device", "cpu")])]
    return [str(getattr(contender, "device", "cpu"))]


def synchronize_cuda(devices: list[str]) -> None:
    """Wait until the CUDA devices among ``devices`` have finished their queued work (CPU: no-op).

    Rounds already end synchronised: fedsim's serial and vmap executors copy every update to a CPU
    tensor (which waits for the GPU), process workers hand back results in shared CPU memory, and the
    centralized contenders read a loss after their last step. This is the safeguard that keeps a
    contender that stops doing so from being timed short.
    """
    for device in devices:
        if device.startswith("cuda") and torch.cuda.is_initialized():
            torch.cuda.synchronize(device)


def summarize(result: dict[str, Any], warmup: int) -> dict[str, Any]:
    """Median (and min) of the timed rounds; how busy others kept the machine during them."""
    timed_rounds = result["round_s"][warmup:]
    others = result.get("others_cores", [])[warmup:]
    out = {k: v for k, v in result.items() if k != "params"}
    out["timed_round_s"] = timed_rounds
    out["median_round_s"] = statistics.median(timed_rounds) if timed_rounds else None
    out["min_round_s"] = min(timed_rounds) if timed_rounds else None
    out["max_others_cores"] = max(others) if others else None
    cpu = result.get("own_cpu_s", [])[warmup:]
    out["median_cpu_s"] = statistics.median(cpu) if cpu else None
    return out


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator and denominator else None


def targets(rows: dict[str, dict[str, Any]], stat: str = "median_round_s") -> dict[str, Any]:
    """The issue's ratios and whether each target holds (``None`` when a contender did not run)."""
    med = {k: v.get(stat) for k, v in rows.items()}
    speed_t1 = ratio(med.get("serial_t1"), med.get("process_w2"))
    naive = {k: ratio(med.get(k), med.get("process_w2")) for k in ("naive_spawn", "naive_fork_t1")}
    overhead = ratio(med.get("process_w1"), med.get("central_t1"))
    return {
        "serial_t1/process_w2": speed_t1, "target_process_w2_1.7x_faster_than_serial_t1": _at_least(speed_t1, 1.7),
        "serial_t2/process_w2": ratio(med.get("serial_t2"), med.get("process_w2")),
        **{f"{k}/process_w2": v for k, v in naive.items()},
        **{f"target_process_w2_2x_faster_than_{k}": _at_least(v, 2.0) for k, v in naive.items()},
        "process_w1/central_t1": overhead,
        "target_process_w1_within_15pct_of_central_t1": None if overhead is None else overhead <= 1.15,
        "central_t1/process_w2": ratio(med.get("central_t1"), med.get("process_w2")),
        "info: serial_t1/process_w2_pt1": ratio(med.get("serial_t1"), med.get("process_w2_pt1")),
        "info: process_w1_pt1/central_t1": ratio(med.get("process_w1_pt1"), med.get("central_t1")),
        "info: naive_fork_t1/process_w2_pt1": ratio(med.get("naive_fork_t1"), med.get("process_w2_pt1")),
    }


def cpu_ratios(rows: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """CPU seconds per round relative to one another: overheads that busy neighbours hardly distort."""
    cpu = {k: v.get("median_cpu_s") for k, v in rows.items()}
    pairs = [("process_w1", "central_t1"), ("process_w1_pt1", "central_t1"), ("serial_t1", "central_t1"),
             ("process_w2", "serial_t1"), ("process_w2_pt1", "serial_t1"),
             ("process_w2", "process_w1"), ("naive_fork_t1", "process_w2"), ("naive_spawn", "process_w2")]
    return {f"cpu {a}/{b}": ratio(cpu.get(a), cpu.get(b)) for a, b in pairs}


def _at_least(value: float | None, bound: float) -> bool | None:
    return None if value is None else value >= bound


def bitwise(results: dict[str, dict[str, Any]]) -> dict[str, bool]:
    """Final global weights of the fedsim contenders compared with ``serial_t1`` (all rounds, warm-up included)."""
    ref = results.get("serial_t1", {}).get("params")
    return {
        f"serial_t1 == {k}": bool(torch.equal(ref, results[k]["params"]))
        for k in ("serial_t2", "process_w1", "process_w2", "process_w1_pt1", "process_w2_pt1", *GPU_CONTENDERS)
        if ref is not None and "params" in results.get(k, {})
    }


def gpu_ratios(rows: dict[str, dict[str, Any]], stat: str = "median_round_s") -> dict[str, float | None]:
    """The GPU questions (> 1: the second one is faster): how much the workers per GPU buy over serial,
    and what one worker costs over centralized training of the same samples."""
    med = {k: v.get(stat) for k, v in rows.items()}
    pairs = [("serial_t1", "process_g1"), ("serial_t1", "process_g2"), ("serial_t1", "process_g4"),
             ("process_g1", "process_g2"), ("process_g1", "process_g4"),
             ("process_g1", "central_t1"), ("serial_t1", "central_t1")]
    return {f"{a}/{b}": ratio(med.get(a), med.get(b)) for a, b in pairs}


def relative_errors(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """``‖w − w_serial_t1‖ / ‖w_serial_t1‖`` of every fedsim contender's final weights (0.0: bitwise equal).
    GPU kernels need not be bitwise reproducible across processes, so this says how far apart they are."""
    ref = results.get("serial_t1", {}).get("params")
    if ref is None:
        return {}
    return {k: float((r["params"] - ref).norm() / ref.norm()) for k, r in results.items() if "params" in r and k != "serial_t1"}


def print_table(model: str, rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\n== {model}: {args.clients} clients, {args.per_round}/round, {args.examples_per_client} examples/client, "
          f"batch {args.batch_size}, epochs {args.epochs}; median of {args.rounds} timed rounds after {args.warmup} warm-up")
    print(f"{'contender':<15}{'median s/round':>16}{'cpu s/round':>13}{'startup s':>11}{'others cores':>14}  timed rounds (s)")
    for name, row in rows.items():
        if row.get("deadlocked"):
            print(f"{name:<15}{'DEADLOCK':>16}{'':>13}{'':>11}{'':>14}  {row['error']}")
            continue
        rounds = ", ".join(f"{s:.3f}" for s in row["timed_round_s"])
        print(f"{name:<15}{row['median_round_s']:>16.3f}{row['median_cpu_s']:>13.2f}{row['startup_s']:>11.2f}"
              f"{row['max_others_cores']:>14.2f}  {rounds}")
    print("(cpu s/round: CPU seconds of this benchmark's processes, median; others cores: the most cores that processes "
          "outside this benchmark kept busy during a timed round)")


def print_targets(model: str, tgt: dict[str, Any], equal: dict[str, bool], cpu: dict[str, float | None]) -> None:
    print(f"-- {model}: ratios (>1 means process_w2 / process_w1 is faster / slower as named)")
    for key, value in tgt.items():
        if key.startswith("target_"):
            verdict = "not measured" if value is None else ("MET" if value else "NOT MET")
            print(f"   {key:<58} {verdict}")
        else:
            print(f"   {key:<58} {'n/a' if value is None else f'{value:.2f}x'}")
    for key, value in equal.items():
        print(f"   bitwise {key:<50} {value}")
    for key, value in cpu.items():
        print(f"   {key:<58} {'n/a' if value is None else f'{value:.2f}x'}")


def code_version() -> dict[str, Any]:
    """The commit benchmarked and any uncommitted changes under fedsim/ (the tree is shared and moves)."""
    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", *cmd], cwd=HERE, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    # ":/fedsim": the package, relative to the repository root (a plain "fedsim" would be experiments/bench/fedsim)
    return {"commit": git("rev-parse", "HEAD"), "dirty_fedsim_files": git("status", "--porcelain", "--", ":/fedsim").splitlines()}


def gpu_info(device: str) -> dict[str, Any]:
    """What the GPU runs were measured on: the device, its name, and the settings that change fp32 results."""
    props = torch.cuda.get_device_properties(device)
    return {
        "device": device, "name": torch.cuda.get_device_name(device), "capability": list(torch.cuda.get_device_capability(device)),
        "total_memory_gib": round(props.total_memory / 2**30, 1), "multiprocessors": props.multi_processor_count,
        "device_count": torch.cuda.device_count(), "torch_cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(), "tf32_cudnn": _tf32_cudnn(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }


def _tf32_cudnn() -> bool | None:
    """cuDNN's TF32 switch (convolutions: the CNN), or None where torch refuses the legacy flag."""
    try:
        return bool(torch.backends.cudnn.allow_tf32)
    except RuntimeError:
        return None


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {
        "cpu": cpu, "logical_cpus": os.cpu_count(), "physical_cores": physical_cores(),
        "gpu": torch.cuda.is_available(), "python": platform.python_version(), "torch": torch.__version__,
        "torch_default_threads": torch.get_num_threads(), "platform": platform.platform(),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--models", default="cnn,2nn", help="comma-separated subset of: " + ",".join(MODELS))
    p.add_argument("--contenders", default=None,
                   help="comma-separated subset of: " + ",".join(CONTENDERS + GPU_CONTENDERS)
                   + f" (default: {','.join(CONTENDERS)}; with a cuda --device: {','.join(GPU_DEFAULT)})")
    p.add_argument("--device", default="cpu",
                   help="cpu (default) or cuda / cuda:N: where serial_t*, process_g* and central_t* train")
    p.add_argument("--num-examples", type=int, default=60_000, help="size of the synthetic training set")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--per-round", type=int, default=10)
    p.add_argument("--examples-per-client", type=int, default=None,
                   help="keep only this many examples per client (default: all, 600 with the defaults)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up rounds before them")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fork-timeout", type=float, default=30.0, help="seconds before naive_fork counts as deadlocked")
    p.add_argument("--naive-timeout", type=float, default=300.0, help="same guard for the other naive variants")
    p.add_argument("--quiet-threshold", type=float, default=0.25,
                   help="a round starts once other processes use fewer cores than this for 1 s ...")
    p.add_argument("--quiet-wait", type=float, default=5.0, help="... or after waiting this many seconds")
    p.add_argument("--out", type=Path, default=HERE / "results.json")
    args = p.parse_args(argv)
    resolve_device_and_contenders(p, args)
    return args


def resolve_device_and_contenders(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Normalise ``--device`` (``cuda`` → ``cuda:0``), pick the default contenders for it, and refuse
    unknown contenders, CPU-only ones on a GPU, and a GPU that is not there (``p.error`` exits with 2)."""
    try:
        device = torch.device(args.device)
    except RuntimeError:
        p.error(f"--device {args.device}: use cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            p.error(f"--device {args.device}: torch.cuda.is_available() is False (torch {torch.__version__})")
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            p.error(f"--device {args.device}: only {torch.cuda.device_count()} CUDA device(s) visible")
        args.device = f"cuda:{index}"
    elif device.type != "cpu":
        p.error(f"--device {args.device}: use cpu, cuda or cuda:N")
    else:
        args.device = "cpu"
    if args.contenders is None:
        args.contenders = ",".join(GPU_DEFAULT if args.device != "cpu" else CONTENDERS)
    names = args.contenders.split(",")
    unknown = [n for n in names if n not in CONTENDERS + GPU_CONTENDERS]
    if unknown:
        p.error(f"--contenders: unknown {','.join(unknown)} (known: {','.join(CONTENDERS + GPU_CONTENDERS)})")
    cpu_only = [n for n in names if n in CPU_ONLY]
    if cpu_only and args.device != "cpu":
        p.error(f"--contenders {','.join(cpu_only)}: CPU-only contenders cannot run with --device {args.device}; "
                f"use {','.join(GPU_DEFAULT)}")


def make_bench(model: str, data: TensorData, shares: list[np.ndarray], args: argparse.Namespace) -> Bench:
    factory = functools.partial(MODELS[model], input_shape=INPUT_SHAPE, num_classes=NUM_CLASSES)
    return Bench(
        name=model, model_factory=factory, data=data, client_indices=shares, per_round=args.per_round,
        warmup=args.warmup, rounds=args.rounds, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
    )


def gpu_report(args: argparse.Namespace) -> bool:
    """The GPU report (ratios between process_g*, serial_t1 and central_t1) on a GPU, or wherever a
    process_g* contender runs (so a CPU smoke run exercises it); otherwise the CPU targets, as before."""
    return args.device != "cpu" or any(name in GPU_CONTENDERS for name in args.contenders.split(","))


def num_params(bench: Bench) -> int:
    return sum(p.numel() for p in bench.model_factory().parameters())


def cpu_model_report(model: str, bench: Bench, results: dict[str, dict[str, Any]], rows: dict[str, dict[str, Any]],
                     args: argparse.Namespace) -> dict[str, Any]:
    """Print one model's table and the issue's targets; return its part of the JSON report."""
    tgt, equal = targets(rows), bitwise(results)
    print_table(model, rows, args)
    print_targets(model, tgt, equal, cpu_ratios(rows))
    return {"contenders": rows, "ratios_and_targets": tgt, "bitwise_equal": equal,
            "ratios_and_targets_on_min_round": targets(rows, "min_round_s"), "cpu_ratios": cpu_ratios(rows),
            "num_params": num_params(bench)}


def gpu_model_report(model: str, bench: Bench, results: dict[str, dict[str, Any]], rows: dict[str, dict[str, Any]],
                     args: argparse.Namespace) -> dict[str, Any]:
    """Print one model's table and the GPU ratios; return its part of the JSON report."""
    ratios, equal, errors = gpu_ratios(rows), bitwise(results), relative_errors(results)
    print_table(model, rows, args)
    print(f"-- {model} on {args.device}: ratios of median round times (> 1: the second one is faster)")
    for key, value in ratios.items():
        print(f"   {key:<58} {'n/a' if value is None else f'{value:.2f}x'}")
    for key, value in equal.items():
        print(f"   bitwise {key:<50} {value}")
    print(f"   relative error of the final weights vs serial_t1: {errors}")
    return {"contenders": rows, "gpu_ratios": ratios, "gpu_ratios_on_min_round": gpu_ratios(rows, "min_round_s"),
            "bitwise_equal": equal, "relative_error_vs_serial_t1": errors, "num_params": num_params(bench)}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    QUIET.update(threshold_cores=args.quiet_threshold, max_wait_s=args.quiet_wait)
    data = mnist_shaped(args.num_examples, args.seed)
    shares = iid(data.labels, num_clients=args.clients, seed=args.seed)
    if args.examples_per_client is not None:
        shares = [s[: args.examples_per_client] for s in shares]
    args.examples_per_client = args.examples_per_client or int(statistics.median(len(s) for s in shares))
    report: dict[str, Any] = {"machine": machine(), "code": code_version(), "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "models": {}}
    print(json.dumps(report["machine"]))
    if args.device != "cpu":
        report["device"] = gpu_info(args.device)
        print(json.dumps(report["device"]))
    with tempfile.TemporaryDirectory(prefix="fedsim-bench-") as tmp:
        for model in args.models.split(","):
            bench = make_bench(model, data, shares, args)
            contenders = [make_contender(name, bench, args, Path(tmp) / model) for name in args.contenders.split(",")]
            results = run_interleaved(bench, contenders)
            rows = {k: summarize(v, args.warmup) for k, v in results.items()}
            if gpu_report(args):
                report["models"][model] = gpu_model_report(model, bench, results, rows, args)
            else:
                report["models"][model] = cpu_model_report(model, bench, results, rows, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
