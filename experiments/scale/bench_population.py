"""Build time, steady round and peak RSS of a federation of 10^3..10^6 devices (issue #35), and the process
executor's worker start-up with a list of clients against a population.

Every size runs in a fresh interpreter (peak RSS only grows within a process) with issue #35's command:
``data.num_devices=N +data.size_mean_log=0 +data.size_sigma_log=0 +data.min_size=9 clients_per_round=10
logger=quiet``, serial, evaluation only at the last round (``eval_every=num_rounds``). The child times, in order:
the Synthetic generator (``data``), :func:`fedsim.cli.run.federate` (``federate``), the rest of
:func:`fedsim.cli.run.build_server` (``server``: clients, model, strategy, store; the data handed over as built),
then every round; ``round`` is the median of the rounds before the last (the last one evaluates). ``build`` is
``federate + server``: everything after the data exists. ``data MiB`` is the bytes of the training and test tensors.

Usage (from the repository root)::

    .venv/bin/python experiments/scale/bench_population.py                       # FedAvg, 10^3..10^5
    .venv/bin/python experiments/scale/bench_population.py --sizes 1000000
    .venv/bin/python experiments/scale/bench_population.py --strategy scaffold --state-store disk
    .venv/bin/python experiments/scale/bench_population.py --startup 100000      # list vs population, 2 workers
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MIB = 1 << 20
ISSUE = ["+data.size_mean_log=0", "+data.size_sigma_log=0", "+data.min_size=9", "clients_per_round=10", "logger=quiet"]


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def measure_run(devices: int, strategy: str, state_store: str, rounds: int) -> dict[str, Any]:
    """In the child: one run of issue #35's command, timed phase by phase."""
    import fedsim.cli.run as run

    overrides = [f"data.num_devices={devices}", *ISSUE, f"strategy={strategy}", f"state_store={state_store}"]
    cfg = run.compose([*overrides, f"num_rounds={rounds}", f"eval_every={rounds}", "executor=serial"])
    imported = _peak_mib()
    start = time.perf_counter()
    split = run._instantiate(cfg.data)
    data_s = time.perf_counter() - start
    start = time.perf_counter()
    data = run.federate(
        split,
        run._instantiate(cfg.partition),
        client_test_fraction=cfg.client_test_fraction,
        seed=run.partition_seed(cfg.seed),
    )
    federate_s = time.perf_counter() - start
    run.build_data = lambda _cfg: data  # the rest of build_server, on the data just built
    with tempfile.TemporaryDirectory() as run_dir:
        start = time.perf_counter()
        server = run.build_server(cfg, run_dir)
        server_s = time.perf_counter() - start
        times: list[float] = []
        plain = server.run_round

        def timed(round_num: int) -> Any:
            began = time.perf_counter()
            try:
                return plain(round_num)
            finally:
                times.append(time.perf_counter() - began)

        server.run_round = timed  # type: ignore[method-assign]
        result = server.run()
    data_bytes = sum(t.nbytes for part in (split.train, split.test) for t in (part.x, part.y))
    return {
        "devices": devices,
        "strategy": strategy,
        "state_store": state_store,
        "data_MiB": data_bytes / MIB,
        "data_s": data_s,
        "federate_s": federate_s,
        "server_s": server_s,
        "build_s": federate_s + server_s,
        "round_s": statistics.median(times[:-1]),
        "last_round_s": times[-1],
        "peak_MiB": _peak_mib(),
        "after_imports_MiB": imported,
        "final_params_sum": float(result.params.double().sum()),
    }


def measure_startup(devices: int, workers: int) -> dict[str, Any]:
    """In the child: ProcessExecutor start-up (to every worker ready) with the clients as a list and as a population."""
    import fedsim.cli.run as run
    from fedsim.client.federation import make_clients, make_population
    from fedsim.executor import ProcessExecutor
    from fedsim.executor.base import Workload

    cfg = run.compose([f"data.num_devices={devices}", *ISSUE])
    data = run.build_data(cfg)
    factory = run._instantiate(cfg.client)
    model_factory = run.build_model_factory(cfg, data)
    out: dict[str, Any] = {"devices": devices, "workers": workers}
    for name, clients in (("list", make_clients(data, factory)), ("population", make_population(data, factory))):
        executor = ProcessExecutor(devices="cpu", workers=workers, threads=1)
        start = time.perf_counter()
        executor.start(Workload(model_factory, clients, data.train))
        out[f"{name}_start_s"] = time.perf_counter() - start
        executor.close()
    return out


def child(args: list[str]) -> list[dict[str, Any]]:
    """Run the command in a fresh interpreter and read back its JSON line."""
    done = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{done.stderr[-3000:]}")
    return [json.loads(done.stdout.strip().splitlines()[-1])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--strategy", default="fedavg")
    parser.add_argument("--state-store", default="memory")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--startup", type=int, default=0, help="devices for the worker start-up comparison")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=HERE / "results_population.json")
    args = parser.parse_args()
    if args.child:
        if args.startup:
            row = measure_startup(args.startup, args.workers)
        else:
            row = measure_run(args.sizes[0], args.strategy, args.state_store, args.rounds)
        print(json.dumps(row))
        return
    rows: list[dict[str, Any]] = []
    if args.startup:
        rows += child(["--startup", str(args.startup), "--workers", str(args.workers)])
    else:
        for size in args.sizes:
            common = ["--strategy", args.strategy, "--state-store", args.state_store, "--rounds", str(args.rounds)]
            rows += child(["--sizes", str(size), *common])
            print(json.dumps(rows[-1]), flush=True)
    old = json.loads(args.out.read_text()) if args.out.exists() else []
    args.out.write_text(json.dumps(old + rows, indent=1) + "\n")
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
