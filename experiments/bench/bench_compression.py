"""Update compression's overhead: per-round wall time with each codec against float32 updates (``compression=none``).

Issue #19's target: fp16 updates on the 2NN cost at most 1.1x a plain round. Two measures, in one run:

* ``rounds``: the McMahan et al. 2017 MNIST workload of the other benchmarks (``workload.py``: 60,000 synthetic
  1x28x28 images, 100 IID clients of 600, 10 per round, E=1, B=10, SGD lr 0.01, FedAvg, seed 0), fedsim's
  ``Server`` with the serial executor (1 thread; the server's own work on 1 thread too, as ``Server.run`` sets it)
  and no evaluation. One contender per compression setting, each built from the config a run composes
  (``compression=fp16``, ``'compression.uplink=[{name: qsgd, bits: 2}]'``, ...). Every contender samples the same
  clients, which train the same number of steps, so only the codec's work differs. Rounds are interleaved, the
  order rotating every round, so all contenders meet the same background load; the median wall time per round, its
  ratio to ``none``, and the time the round spent in the server's encoding and decoding (``Exchange.broadcast`` +
  ``Exchange.receive``, timed inside the round).
* ``codec``: each setting on one update of the model's size, 1 thread, median of repeats, microseconds per update:
  ``chain_us`` is the uplink chain alone (encode + decode, ``Chain.apply``); ``receive_us`` the server's whole
  handling of an arriving update (the soundness check, Δ = trained − received, error feedback, the chain,
  global + decoded Δ; ``Exchange.receive``), which a round pays once per client.

Run from the repository root::

    nice -n 10 .venv/bin/python experiments/bench/bench_compression.py --quiet-wait 0  # writes results_compression.json
    nice -n 10 .venv/bin/python experiments/bench/bench_compression.py --quiet-wait 0 --models cnn --rounds 4 \
        --out experiments/bench/results_compression_cnn.json  # the CNN (1.66 M weights)
    .venv/bin/python experiments/bench/bench_compression.py --rounds 1 --examples-per-client 60 \
        --codec-repeats 3  # smoke run
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import workload  # noqa: E402

from fedsim import Client, FedAvg, Server  # noqa: E402
from fedsim.comm.pipeline import Compression  # noqa: E402
from fedsim.core.threads import torch_threads  # noqa: E402
from fedsim.executor import SerialExecutor, Workload  # noqa: E402
from fedsim.run import build_compression, compose  # noqa: E402
from fedsim.server import Federation, Schedule, Stages
from fedsim.server.exchange import Exchange  # noqa: E402
from fedsim.types import ClientUpdate  # noqa: E402

SETTINGS: dict[str, list[str]] = {  # contender: the overrides a run would be given
    "none": ["compression=none"],
    "fp16": ["compression=fp16"],
    "qsgd8": ["compression=qsgd"],
    "qsgd2": ["compression=qsgd", "compression.uplink=[{name: qsgd, bits: 2}]"],
    "topk": ["compression=topk"],  # 1 %, with error feedback
    "random_mask": ["compression=random_mask"],  # 10 %
}


def compression_of(name: str) -> Compression:
    """The ``Compression`` a run composed with ``SETTINGS[name]`` gets (the same code path as ``python -m fedsim``)."""
    return build_compression(compose(["logger=quiet", *SETTINGS[name]]))


class CodecRounds:
    """A contender for :func:`harness.run_interleaved`: fedsim's Server with one compression setting, one round at a
    time, its encoding and decoding timed inside the round."""

    def __init__(self, name: str, bench: workload.Bench, log_dir: Path) -> None:
        self.name, self.bench, self.log_dir = name, bench, log_dir
        self.compression = compression_of(name)
        optimizer = functools.partial(torch.optim.SGD, lr=bench.lr)
        clients = [
            Client(i, idx, epochs=bench.epochs, batch_size=bench.batch_size, optimizer=optimizer)
            for i, idx in enumerate(bench.client_indices)
        ]
        self.server = Server(
            model_factory=bench.model_factory,
            federation=Federation(clients=clients, train_data=bench.data, test_data=None),
            strategy=FedAvg(),
            executor=SerialExecutor(threads=1),
            schedule=Schedule(num_rounds=bench.total_rounds, clients_per_round=bench.per_round),
            seed=bench.seed,
            stages=Stages(compression=self.compression),
        )
        self.codec_s: list[float] = []  # per round: seconds inside Exchange.broadcast and Exchange.receive
        self.bytes_up: list[float] = []
        self._in_codec = 0.0
        for method in ("broadcast", "receive"):
            harness.time_calls(self.server.parts.comm, method, self._add_codec_time)

    def _add_codec_time(self, seconds: float) -> None:
        self._in_codec += seconds

    def start(self) -> None:
        workload_ = Workload(
            self.bench.model_factory,
            self.server.clients,
            self.bench.data,
            log_dir=self.log_dir,
            local=self.server.strategy.local_training(),
        )
        self.server.parts.local = workload_.local
        self.server.parts.executor.start(workload_)

    def run_round(self, round_num: int) -> None:
        self._in_codec = 0.0
        with torch_threads(self.server.threads):  # as Server.run
            metrics = self.server.run_round(round_num)
        self.codec_s.append(self._in_codec)
        self.bytes_up.append(metrics["comm/bytes_up"])

    def close(self) -> None:
        self.server.parts.executor.close()

    def info(self) -> dict[str, Any]:
        return {
            "compression": repr(self.compression),
            "codec_s": self.codec_s,
            "bytes_up_per_round": self.bytes_up,
            "final_params_sum": float(self.server.params.double().sum()),
        }


def codec_us(name: str, num_params: int, repeats: int) -> dict[str, Any]:
    """Median microseconds per update of the uplink chain alone and of the server's whole receive, on one
    update-sized vector (a trained model 1e-2 away from the global one), 1 thread."""
    compression = compression_of(name)
    gen = torch.Generator().manual_seed(0)
    global_params = torch.randn(num_params, generator=gen) * 0.05
    trained = global_params + torch.randn(num_params, generator=gen) * 1e-2
    exchange = Exchange(compression, num_params, seed=0)
    received = exchange.broadcast(global_params, 1)
    update = ClientUpdate(client_id=3, round_num=1, params=trained, num_examples=600, state={})
    delta, chain, receive = trained - received, [], []
    with torch_threads(1):
        for _ in range(repeats):
            start = time.perf_counter()
            compression.uplink.apply(delta, torch.Generator().manual_seed(1))
            chain.append(time.perf_counter() - start)
            start = time.perf_counter()
            exchange.receive(update, received, global_params, {})
            receive.append(time.perf_counter() - start)
    return {
        "chain_us": statistics.median(chain) * 1e6,
        "receive_us": statistics.median(receive) * 1e6,
        "bytes_up": compression.uplink.nbytes(num_params),
    }


def measure(model: str, data: Any, shares: Any, args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    """The interleaved rounds and the codec timings of one model."""
    bench = workload.make_bench(model, data, shares, args)
    num_params = bench.num_params()
    with tempfile.TemporaryDirectory() as log_dir:
        rows = harness.run_interleaved(
            [CodecRounds(n, bench, Path(log_dir)) for n in names], bench.total_rounds, tag=model
        )
    summary = {name: harness.summarize(row, args.warmup) for name, row in rows.items()}
    base = summary["none"]
    for row in summary.values():
        codec = row["codec_s"][args.warmup :]
        row["median_codec_s"] = statistics.median(codec) if codec else None
        row["ratio_to_none"] = harness.ratio(row["median_round_s"], base["median_round_s"])
        # the same round of both (met in the same stretch of load), then the median over rounds
        paired = [t / b for t, b in zip(row["timed_round_s"], base["timed_round_s"], strict=True)]
        row["paired_ratio_to_none"] = statistics.median(paired) if paired else None
        row["cpu_ratio_to_none"] = harness.ratio(row["median_cpu_s"], base["median_cpu_s"])
        row["codec_share_of_none_round"] = harness.ratio(row["median_codec_s"], base["median_round_s"])
    codecs = {}
    for name in names:
        codecs[name] = codec_us(name, num_params, args.codec_repeats)
        print(
            f"[{model}] {name}: chain {codecs[name]['chain_us']:.0f} us, receive {codecs[name]['receive_us']:.0f} us",
            file=sys.stderr,
        )
    return {"num_params": num_params, "rounds": summary, "codec": codecs}


def print_model(model: str, result: dict[str, Any], per_round: int) -> None:
    harness.print_rows(
        f"{model}: per-round wall time, serial executor ({result['num_params']:,} parameters)",
        result["rounds"],
        extra=(("ratio to none", "ratio_to_none"),),
    )
    print(
        f"\n{'setting':<13}{'KB up/update':>13}{'s/round':>9}{'ratio':>7}{'paired':>8}{'cpu':>7}{'codec ms/round':>16}"
        f"{'share':>7}{'chain us':>10}{'receive us':>12}{f'x{per_round} ms':>10}"
    )
    nan = float("nan")
    for name, row in result["rounds"].items():
        codec = result["codec"][name]
        print(
            f"{name:<13}{codec['bytes_up'] / 1e3:>13.1f}{row['median_round_s'] or nan:>9.4f}"
            f"{row['ratio_to_none'] or nan:>7.3f}{row['paired_ratio_to_none'] or nan:>8.3f}"
            f"{row['cpu_ratio_to_none'] or nan:>7.3f}{(row['median_codec_s'] or 0.0) * 1e3:>16.2f}"
            f"{row['codec_share_of_none_round'] or nan:>7.3f}{codec['chain_us']:>10.0f}{codec['receive_us']:>12.0f}"
            f"{codec['receive_us'] * per_round / 1e3:>10.2f}"
        )
    print(
        "ratio: median s/round over none's; paired: median over rounds of the same round's ratio; cpu: median CPU "
        "s/round over none's; codec ms/round: inside Exchange.broadcast + receive during the round; share: that over "
        "none's median round; chain/receive us: one update alone (x{n}: receive times the clients of a round)".replace(
            "{n}", str(per_round)
        )
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_common_args(p, repeats=("--rounds", 8, "timed rounds per contender"), warmup=1, quiet_wait=5.0)
    workload.add_workload_args(p, models="2nn")
    p.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated subset of: " + ",".join(SETTINGS))
    p.add_argument("--codec-repeats", type=int, default=50, help="repeats of the codec-alone timings")
    args = p.parse_args(argv)
    names = ["none", *[n for n in args.settings.split(",") if n != "none"]]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        p.error(f"unknown settings {unknown}; use: {', '.join(SETTINGS)}")
    report = {
        "command": " ".join(["python", *sys.argv]),
        "settings": {n: SETTINGS[n] for n in names},
        **harness.new_report(args, harness.HERE / "results_compression.json"),
    }
    data, shares = workload.mnist_clients(args)
    models = args.models.split(",")
    with harness.busy_machine(args.load) as load:
        report["models"] = {model: measure(model, data, shares, args, names) for model in models}
        report["load"] = load.record()
    for model in models:
        print_model(model, report["models"][model], args.per_round)
    fp16 = report["models"].get("2nn", {}).get("rounds", {}).get("fp16", {}).get("ratio_to_none")
    if fp16 is not None:
        print(f"\n2NN fp16 / none: {fp16:.3f} (target <= 1.1): {'met' if fp16 <= 1.1 else 'NOT met'}")
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
