"""Build time, steady round and peak RSS of a federation of 10^3..10^6 devices (issue #35), and the process
executor's worker start-up with a list of clients against a population.

Every size runs in a fresh interpreter (peak RSS only grows within a process) with issue #35's command:
``data.num_devices=N +data.size_mean_log=0 +data.size_sigma_log=0 +data.min_size=9 clients_per_round=10
logger=quiet``, serial, evaluation only at the last round (``eval_every=num_rounds``). The child times, in order:
the Synthetic generator (``data``), :func:`fedsim.cli.run.federate` (``federate``), the rest of
:func:`fedsim.cli.run.build_server` (``server``: clients, model, strategy, store; the data handed over as built),
then every round; ``round`` is the median of the rounds before the last (the last one evaluates). ``build`` is
``federate + server``: everything after the data exists; ``wall`` is the whole run, data to the last round's end.
``data MiB`` is the bytes of the training and test tensors; ``checkpoint MiB`` the final checkpoint's files and
``client_state MiB`` the disk store's (under ``checkpoints/client_state``).

Usage (from the repository root)::

    .venv/bin/python experiments/scale/bench_population.py                       # FedAvg, 10^3..10^5
    .venv/bin/python experiments/scale/bench_population.py --sizes 1000000
    .venv/bin/python experiments/scale/bench_population.py --strategy scaffold --state-store disk
    .venv/bin/python experiments/scale/bench_population.py --startup 100000      # list vs population, 2 workers
    .venv/bin/python experiments/scale/bench_population.py --resume --rounds 3 --sizes 1000000 \
        --strategy scaffold --state-store disk                                   # resume from round 2: bitwise?
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


def _mib_under(folder: Path) -> float:
    """The bytes of every file under ``folder`` (0 when it does not exist), in MiB."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / MIB if folder.exists() else 0.0


def measure_run(devices: int, strategy: str, state_store: str, rounds: int) -> dict[str, Any]:
    """In the child: one run of issue #35's command, timed phase by phase."""
    import fedsim.cli.run as run

    overrides = [f"data.num_devices={devices}", *ISSUE, f"strategy={strategy}", f"state_store={state_store}"]
    cfg = run.compose([*overrides, f"num_rounds={rounds}", f"eval_every={rounds}", "executor=serial"])
    imported = _peak_mib()
    start = began = time.perf_counter()
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
        wall_s = time.perf_counter() - began
        client_state_mib = _mib_under(Path(run_dir) / "checkpoints" / "client_state")  # the disk store's files
        checkpoint_mib = _mib_under(Path(run_dir) / "checkpoints") - client_state_mib
    data_bytes = sum(t.nbytes for part in (split.train, split.test) for t in (part.x, part.y))
    return {
        "devices": devices,
        "strategy": strategy,
        "state_store": state_store,
        "data_MiB": data_bytes / MIB,
        "wall_s": wall_s,
        "data_s": data_s,
        "federate_s": federate_s,
        "server_s": server_s,
        "build_s": federate_s + server_s,
        "round_s": statistics.median(times[:-1]),
        "last_round_s": times[-1],
        "checkpoint_MiB": checkpoint_mib,
        "client_state_MiB": client_state_mib,
        "peak_MiB": _peak_mib(),
        "after_imports_MiB": imported,
        "final_params_sum": float(result.params.double().sum()),
    }


def measure_resume(devices: int, strategy: str, state_store: str, run_dir: Path, rounds: int) -> dict[str, Any]:
    """In the child: without ``run_dir/full.pt``, ``rounds`` rounds in ``run_dir`` with a checkpoint every round,
    their final weights saved there; with it, the run again from its checkpoint of round ``rounds - 1`` (a fresh
    interpreter, the data generated again, the disk store already holding the last round's states), its final
    weights compared bitwise with the saved ones."""
    import torch

    import fedsim.cli.run as run
    from fedsim.core.checkpoint import checkpoint_path

    saved = run_dir / "full.pt"
    overrides = [f"data.num_devices={devices}", *ISSUE, f"strategy={strategy}", f"state_store={state_store}"]
    common = [f"num_rounds={rounds}", f"eval_every={rounds}", "executor=serial", "checkpoint_every=1"]
    resume = [f"resume={checkpoint_path(run_dir / 'checkpoints', rounds - 1)}"] if saved.exists() else []
    start = time.perf_counter()
    server = run.build_server(run.compose([*overrides, *common, *resume]), run_dir)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    params = server.run().params
    run_s = time.perf_counter() - start
    row = {"devices": devices, "strategy": strategy, "state_store": state_store, "rounds": rounds}
    row |= {"resumed": bool(resume), "build_s": build_s, "run_s": run_s, "peak_MiB": _peak_mib()}
    if not resume:
        torch.save(params, saved)
        last = checkpoint_path(run_dir / "checkpoints", rounds).stat().st_size / MIB
        return row | {"checkpoint_MiB": last, "client_state_MiB": _mib_under(run_dir / "checkpoints" / "client_state")}
    return row | {"start_round": server.start_round, "bitwise_equal": bool(torch.equal(params, torch.load(saved)))}


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


def resume_rows(sizes: list[int], strategy: str, state_store: str, rounds: int) -> list[dict[str, Any]]:
    """For each size, two children in one run directory: the whole run, then the resume from its last-but-one
    checkpoint; fails unless the final weights are bitwise equal."""
    rows: list[dict[str, Any]] = []
    for size in sizes:
        with tempfile.TemporaryDirectory() as run_dir:
            common = ["--resume", "--sizes", str(size), "--strategy", strategy, "--state-store", state_store]
            for _ in ("full", "resumed"):
                rows += child([*common, "--rounds", str(rounds), "--run-dir", run_dir])
                print(json.dumps(rows[-1]), flush=True)
        if not rows[-1]["bitwise_equal"]:
            raise SystemExit(f"{size} devices, {strategy}: the resumed run's final weights differ")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--strategy", default="fedavg")
    parser.add_argument("--state-store", default="memory")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--startup", type=int, default=0, help="devices for the worker start-up comparison")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--resume", action="store_true", help="run, then resume from the last-but-one checkpoint")
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="default: results_population.json (results_resume.json with --resume)")
    args = parser.parse_args()
    args.out = args.out or HERE / ("results_resume.json" if args.resume else "results_population.json")
    if args.child:
        if args.startup:
            row = measure_startup(args.startup, args.workers)
        elif args.resume:
            row = measure_resume(args.sizes[0], args.strategy, args.state_store, args.run_dir, args.rounds)
        else:
            row = measure_run(args.sizes[0], args.strategy, args.state_store, args.rounds)
        print(json.dumps(row))
        return
    rows: list[dict[str, Any]] = []
    if args.startup:
        rows += child(["--startup", str(args.startup), "--workers", str(args.workers)])
    elif args.resume:
        rows += resume_rows(args.sizes, args.strategy, args.state_store, args.rounds)
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
