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

Rounds are interleaved by ``harness.run_interleaved`` (every contender started, then round r of each in
turn, the order rotating, each round after a quiet second when one comes within ``--quiet-wait`` s); per
round it records the wall time, our CPU and the cores OTHER processes used. ``--load N`` measures on a busy
machine (``harness.busy_machine``). The workload and the fedsim / centralized contenders are in
``workload.py``. Benchmarks are measurements, not tests: nothing here asserts a time.

Run from the repository root::

    .venv/bin/python experiments/bench/bench_executors.py     # both models, full workload: ~15-25 min on 2 cores
    .venv/bin/python experiments/bench/bench_executors.py --examples-per-client 300   # about half that
    .venv/bin/python experiments/bench/bench_executors.py --models 2nn --rounds 5
    .venv/bin/python experiments/bench/bench_executors.py --device cuda --models 2nn   # on a GPU
    .venv/bin/python experiments/bench/bench_executors.py --load 1      # other jobs on 1 core: results_load1.json
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (timing, reporting, --load)
from workload import (  # noqa: E402  (the shared workload and contenders)
    Bench,
    CentralContender,
    FedsimContender,
    add_workload_args,
    make_bench,
    mnist_clients,
    relative_errors,
)

from fedsim import SerialExecutor  # noqa: E402
from fedsim.executor import ProcessExecutor  # noqa: E402
from fedsim.seeding import task_seed  # noqa: E402

CONTENDERS = (
    "serial_t1",
    "serial_t2",
    "process_w1",
    "process_w2",
    "process_w1_pt1",
    "process_w2_pt1",
    "naive_fork",
    "naive_spawn",
    "naive_fork_t1",
    "central_t1",
    "central_t2",
)
GPU_CONTENDERS = ("process_g1", "process_g2", "process_g4")  # ProcessExecutor on --device (any device)
GPU_DEFAULT = ("serial_t1", "process_g1", "process_g2", "process_g4", "central_t1")
CPU_ONLY = (
    "process_w1",
    "process_w2",
    "process_w1_pt1",
    "process_w2_pt1",
    "naive_fork",
    "naive_spawn",
    "naive_fork_t1",
)


# --------------------------------------------------------------------------------------------------
# the naive recipe, written as users commonly write it


class User:
    """A user object of the naive recipe: its own model and a DataLoader over its own data."""

    def __init__(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int, epochs: int, lr: float
    ) -> None:
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


class Deadlock(harness.Abandon):
    """A pool's first result did not arrive in time."""

    fields = {"deadlocked": True}


def kill_pool(pool: cf.ProcessPoolExecutor) -> None:
    """SIGKILL the worker processes this pool started (by pid) and abandon the pool."""
    for pid in list(getattr(pool, "_processes", {}) or {}):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    pool.shutdown(wait=False, cancel_futures=True)


def pool_map(
    ctx: mp.context.BaseContext, workers: int, calls: list[Callable[[], Any]], first_timeout: float
) -> list[Any]:
    """A NEW process pool, one task per call, results in submission order; raise Deadlock on a stall."""
    pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
    futures = [pool.submit(call) for call in calls]
    try:
        first = futures[0].result(timeout=first_timeout)
    except cf.TimeoutError:
        kill_pool(pool)
        raise Deadlock(f"deadlock (no result after {first_timeout:g} s); pool killed") from None
    results = [first] + [f.result() for f in futures[1:]]
    pool.shutdown(wait=True)
    return results


def fedavg_states(states: list[dict[str, torch.Tensor]], weights: list[int]) -> dict[str, torch.Tensor]:
    total = float(sum(weights))
    return {k: sum(s[k] * (w / total) for s, w in zip(states, weights, strict=True)) for k in states[0]}


class NaiveContender:
    """The naive recipe: users built once, a NEW pool per round, user objects pickled per task,
    ``state_dict()`` back, ``load_state_dict`` + FedAvg in the parent."""

    def __init__(
        self, name: str, bench: Bench, start_method: str, parent_threads: int | None, first_timeout: float
    ) -> None:
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
            for cid, user_state in zip(ids, states, strict=True):
                self.users[cid].model.load_state_dict(user_state)
            sizes = [len(self.users[c].loader.dataset) for c in ids]
            self.global_model.load_state_dict(fedavg_states(states, sizes))
        finally:
            torch.set_num_threads(previous)

    def close(self) -> None:
        self.users = []

    def info(self) -> dict[str, Any]:
        return {"child_threads": self.threads, "start_method": self.ctx.get_start_method()}


def make_contender(name: str, bench: Bench, args: argparse.Namespace, log_dir: Path) -> Any:
    """The contender called ``name``, training on ``args.device`` where it has a device."""
    device = getattr(args, "device", "cpu")
    if name.startswith("serial_t"):
        return FedsimContender(name, bench, SerialExecutor(device=device, threads=int(name[-1])), log_dir / name)
    if name.startswith("process_g"):
        executor = ProcessExecutor(devices=[device], workers_per_device=int(name[len("process_g") :]), threads=1)
        return FedsimContender(name, bench, executor, log_dir / name)
    if name.startswith("process_w"):
        workers, parent_threads = int(name[len("process_w")]), (1 if name.endswith("_pt1") else None)
        executor = ProcessExecutor(devices="cpu", workers=workers, threads=1)
        return FedsimContender(
            name, bench, executor, log_dir / name, parent_threads=parent_threads, server_threads=None
        )  # the server's threads: torch's default, or 1 for *_pt1
    if name == "naive_fork":
        return NaiveContender(name, bench, "fork", None, args.fork_timeout)
    if name == "naive_spawn":
        return NaiveContender(name, bench, "spawn", None, args.naive_timeout)
    if name == "naive_fork_t1":
        return NaiveContender(name, bench, "fork", 1, args.naive_timeout)
    if name.startswith("central_t"):
        return CentralContender(name, bench, int(name[-1]), device)
    raise ValueError(f"unknown contender {name}")


# --------------------------------------------------------------------------------------------------
# what is compared


def _at_least(value: float | None, bound: float) -> bool | None:
    return None if value is None else value >= bound


def targets(rows: dict[str, dict[str, Any]], stat: str = "median_round_s") -> dict[str, Any]:
    """The issue's ratios and whether each target holds (``None`` when a contender did not run)."""
    med = {k: v.get(stat) for k, v in rows.items()}
    speed_t1 = harness.ratio(med.get("serial_t1"), med.get("process_w2"))
    naive = {k: harness.ratio(med.get(k), med.get("process_w2")) for k in ("naive_spawn", "naive_fork_t1")}
    overhead = harness.ratio(med.get("process_w1"), med.get("central_t1"))
    return {
        "serial_t1/process_w2": speed_t1,
        "target_process_w2_1.7x_faster_than_serial_t1": _at_least(speed_t1, 1.7),
        "serial_t2/process_w2": harness.ratio(med.get("serial_t2"), med.get("process_w2")),
        **{f"{k}/process_w2": v for k, v in naive.items()},
        **{f"target_process_w2_2x_faster_than_{k}": _at_least(v, 2.0) for k, v in naive.items()},
        "process_w1/central_t1": overhead,
        "target_process_w1_within_15pct_of_central_t1": None if overhead is None else overhead <= 1.15,
        "central_t1/process_w2": harness.ratio(med.get("central_t1"), med.get("process_w2")),
        "info: serial_t1/process_w2_pt1": harness.ratio(med.get("serial_t1"), med.get("process_w2_pt1")),
        "info: process_w1_pt1/central_t1": harness.ratio(med.get("process_w1_pt1"), med.get("central_t1")),
        "info: naive_fork_t1/process_w2_pt1": harness.ratio(med.get("naive_fork_t1"), med.get("process_w2_pt1")),
    }


def cpu_ratios(rows: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """CPU seconds per round relative to one another: overheads that busy neighbours hardly distort."""
    cpu = {k: v.get("median_cpu_s") for k, v in rows.items()}
    pairs = [
        ("process_w1", "central_t1"),
        ("process_w1_pt1", "central_t1"),
        ("serial_t1", "central_t1"),
        ("process_w2", "serial_t1"),
        ("process_w2_pt1", "serial_t1"),
        ("process_w2", "process_w1"),
        ("naive_fork_t1", "process_w2"),
        ("naive_spawn", "process_w2"),
    ]
    return {f"cpu {a}/{b}": harness.ratio(cpu.get(a), cpu.get(b)) for a, b in pairs}


def gpu_ratios(rows: dict[str, dict[str, Any]], stat: str = "median_round_s") -> dict[str, float | None]:
    """The GPU questions (> 1: the second one is faster): how much the workers per GPU buy over serial,
    and what one worker costs over centralized training of the same samples."""
    med = {k: v.get(stat) for k, v in rows.items()}
    pairs = [
        ("serial_t1", "process_g1"),
        ("serial_t1", "process_g2"),
        ("serial_t1", "process_g4"),
        ("process_g1", "process_g2"),
        ("process_g1", "process_g4"),
        ("process_g1", "central_t1"),
        ("serial_t1", "central_t1"),
    ]
    return {f"{a}/{b}": harness.ratio(med.get(a), med.get(b)) for a, b in pairs}


def bitwise(results: dict[str, dict[str, Any]]) -> dict[str, bool]:
    """Final global weights of the fedsim contenders compared with ``serial_t1`` (all rounds, warm-up included)."""
    ref = results.get("serial_t1", {}).get("params")
    return {
        f"serial_t1 == {k}": bool(torch.equal(ref, results[k]["params"]))
        for k in ("serial_t2", "process_w1", "process_w2", "process_w1_pt1", "process_w2_pt1", *GPU_CONTENDERS)
        if ref is not None and "params" in results.get(k, {})
    }


def print_ratios(title: str, values: dict[str, Any], equal: dict[str, bool]) -> None:
    print(title)
    for key, value in values.items():
        if key.startswith("target_"):
            print(f"   {key:<58} {'not measured' if value is None else ('MET' if value else 'NOT MET')}")
        else:
            print(f"   {key:<58} {'n/a' if value is None else f'{value:.2f}x'}")
    for key, value in equal.items():
        print(f"   bitwise {key:<50} {value}")


def model_report(
    model: str,
    bench: Bench,
    results: dict[str, dict[str, Any]],
    rows: dict[str, dict[str, Any]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Print one model's table and its ratios (the issue's CPU targets, or the GPU report); return its JSON part."""
    harness.print_rows(
        f"{model}: {args.clients} clients, {args.per_round}/round, {args.examples_per_client} examples/client, "
        f"batch {args.batch_size}, epochs {args.epochs}; median of {args.rounds} timed rounds after "
        f"{args.warmup} warm-up",
        rows,
    )
    print(
        "(cpu s/round: CPU seconds of this benchmark's processes, median; others cores: the most cores that processes "
        "outside this benchmark kept busy during a timed round; load cores: the --load generator's, median)"
    )
    equal = bitwise(results)
    if args.device != "cpu" or any(name in GPU_CONTENDERS for name in args.contenders.split(",")):
        ratios, errors = gpu_ratios(rows), relative_errors(results)
        print_ratios(
            f"-- {model} on {args.device}: ratios of median round times (> 1: the second one is faster)", ratios, equal
        )
        print(f"   relative error of the final weights vs serial_t1: {errors}")
        return {
            "contenders": rows,
            "gpu_ratios": ratios,
            "gpu_ratios_on_min_round": gpu_ratios(rows, "min_round_s"),
            "bitwise_equal": equal,
            "relative_error_vs_serial_t1": errors,
            "num_params": bench.num_params(),
        }
    tgt, cpu = targets(rows), cpu_ratios(rows)
    print_ratios(
        f"-- {model}: ratios (>1 means process_w2 / process_w1 is faster / slower as named)", {**tgt, **cpu}, equal
    )
    return {
        "contenders": rows,
        "ratios_and_targets": tgt,
        "bitwise_equal": equal,
        "ratios_and_targets_on_min_round": targets(rows, "min_round_s"),
        "cpu_ratios": cpu,
        "num_params": bench.num_params(),
    }


def gpu_info(device: str) -> dict[str, Any]:
    """What the GPU runs were measured on: the device, its name, and the settings that change fp32 results."""
    props = torch.cuda.get_device_properties(device)
    try:
        tf32_cudnn: bool | None = bool(torch.backends.cudnn.allow_tf32)  # convolutions: the CNN
    except RuntimeError:  # where torch refuses the legacy flag
        tf32_cudnn = None
    return {
        "device": device,
        "name": torch.cuda.get_device_name(device),
        "capability": list(torch.cuda.get_device_capability(device)),
        "total_memory_gib": round(props.total_memory / 2**30, 1),
        "multiprocessors": props.multi_processor_count,
        "device_count": torch.cuda.device_count(),
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "tf32_cudnn": tf32_cudnn,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add_workload_args(p, models="cnn,2nn")
    harness.add_common_args(p, repeats=("--rounds", 3, "timed rounds"), warmup=1)
    p.add_argument(
        "--contenders",
        default=None,
        help="comma-separated subset of: "
        + ",".join(CONTENDERS + GPU_CONTENDERS)
        + f" (default: {','.join(CONTENDERS)}; with a cuda --device: {','.join(GPU_DEFAULT)})",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu (default) or cuda / cuda:N: where serial_t*, process_g* and central_t* train",
    )
    p.add_argument("--fork-timeout", type=float, default=30.0, help="seconds before naive_fork counts as deadlocked")
    p.add_argument("--naive-timeout", type=float, default=300.0, help="same guard for the other naive variants")
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
        p.error(
            f"--contenders {','.join(cpu_only)}: CPU-only contenders cannot run with --device {args.device}; "
            f"use {','.join(GPU_DEFAULT)}"
        )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    data, shares = mnist_clients(args)
    report = harness.new_report(args, harness.HERE / "results.json")
    print(json.dumps(report["machine"]))
    if args.device != "cpu":
        report["device"] = gpu_info(args.device)
        print(json.dumps(report["device"]))
    report["models"] = {}
    with tempfile.TemporaryDirectory(prefix="fedsim-bench-") as tmp, harness.busy_machine(args.load) as load:
        for model in args.models.split(","):
            bench = make_bench(model, data, shares, args)
            contenders = [make_contender(name, bench, args, Path(tmp) / model) for name in args.contenders.split(",")]
            results = harness.run_interleaved(contenders, bench.total_rounds, tag=model)
            rows = {k: harness.summarize(v, args.warmup) for k, v in results.items()}
            report["models"][model] = model_report(model, bench, results, rows, args)
    report["load"] = load.record()
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
