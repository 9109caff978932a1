"""Side-by-side benchmark of ``executor=vmap`` over LoRA adapters against the process and serial executors.

Workload: ``experiment=lora_tiny`` (a 2-layer GPT-2 of hidden size 64 over 16 tokens, LoRA r = 8 on ``c_attn``,
FedAvg, Adam lr 0.01, batch 10, 1 local epoch; 20 clients of 20 training windows of 16 tokens) with all 20 clients
every round (``clients_per_round=20``): 2 local steps per client, 40 a round. No evaluation.

Contenders, each a whole fedsim ``Server`` built from the same composed config (only ``executor=`` differs):

* ``serial_t1``   ``executor=serial`` (1 thread): one client after another
* ``process_w2``  ``executor=process executor.workers=2`` (1 thread each): the issue's baseline, both cores
* ``vmap_t1``     ``executor=vmap`` (1 thread): the 20 clients' adapters stacked, one vectorised pass per step over
                  the shared frozen base (one chunk of 20)
* ``vmap_t1_c10`` / ``vmap_t2_c10``  ``executor=vmap executor.chunk_size=10`` on 1 / 2 threads: two chunks of 10
                  clients (half the activations per pass)
* ``vmap_t2``     ``executor=vmap executor.threads=2``: the same on both cores, as process_w2 uses them
* ``wide_t1`` / ``wide_t2``  no federation: one model from the same factory (same base, same adapters), per round
                  as many Adam steps as one client takes (2), each on the 20 clients' batches at once (200 windows):
                  the same arithmetic as a vmap pass, as one dense model, on 1 / 2 threads (the bound for
                  what vectorising the clients can reach)

Rounds are interleaved by experiments/bench/harness.py (``run_interleaved``: round r of every contender in turn, the
order rotating, so all meet the same background load); a round's time is ``Server.run_round`` (sampling, dispatch,
training, aggregation, metrics). The vmap contenders' final adapters are compared with serial's (relative error),
process's bitwise.

Run from the repository root::

    .venv/bin/python experiments/lora/bench_vmap.py                 # 12 rounds (2 warm-up), ~3 minutes on 2 cores
    .venv/bin/python experiments/lora/bench_vmap.py --rounds 20 --contenders serial_t1,process_w2,vmap_t2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import harness  # noqa: E402  (timing, interleaving, reporting)

from fedsim.cli.run import build_data, build_model_factory, build_server, compose  # noqa: E402
from fedsim.server.server import Server  # noqa: E402

EXECUTORS = {
    "serial_t1": ["executor=serial", "executor.threads=1"],
    "process_w2": ["executor=process", "executor.devices=cpu", "executor.workers=2", "executor.threads=1"],
    "vmap_t1": ["executor=vmap", "executor.threads=1"],
    "vmap_t2": ["executor=vmap", "executor.threads=2"],
    "vmap_t1_c10": ["executor=vmap", "executor.threads=1", "executor.chunk_size=10"],
    "vmap_t2_c10": ["executor=vmap", "executor.threads=2", "executor.chunk_size=10"],
}


class RunContender:
    """A ``Server`` built from ``experiment=lora_tiny`` plus ``overrides``, driven round by round as ``Server.run``
    drives it (the executor started with the server's workload, ``run_round``, the executor closed)."""

    def __init__(self, name: str, overrides: list[str], run_dir: Path) -> None:
        self.name = name
        self.server: Server = build_server(compose(overrides), run_dir)

    def start(self) -> None:
        workload = self.server.workload()  # what Server.run starts its executor with
        self.server.parts.local = workload.local
        self.server.parts.executor.start(workload)

    def run_round(self, round_num: int) -> None:
        self.server.run_round(round_num)

    def close(self) -> None:
        self.server.parts.executor.close()
        self.server.logger.close()

    def info(self) -> dict[str, Any]:
        return {"params": self.server.params.clone()}


class WideContender:
    """One model and one Adam optimizer, ``steps`` steps a round, each on a batch of ``width`` windows drawn from
    the training data (the token loss of ``Client.loss``), with ``threads`` intra-op threads."""

    def __init__(self, name: str, overrides: list[str], threads: int) -> None:
        cfg = compose(overrides)
        data = build_data(cfg)
        self.name, self.threads = name, threads
        self.model = build_model_factory(cfg, data)()
        self.x, self.y = data.train.x, data.train.y
        per_client = [len(rows) for rows in data.client_train][: cfg.clients_per_round]
        self.width = cfg.clients_per_round * cfg.client.batch_size
        self.steps = max(-(-n // cfg.client.batch_size) for n in per_client) * cfg.client.epochs
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(trainable, lr=cfg.client.optimizer.lr)
        self.generator = torch.Generator().manual_seed(cfg.seed)

    def start(self) -> None:
        pass

    def run_round(self, round_num: int) -> None:
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            for _ in range(self.steps):
                rows = torch.randint(len(self.x), (self.width,), generator=self.generator)
                loss = torch.nn.functional.cross_entropy(self.model(self.x[rows]).transpose(1, 2), self.y[rows])
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
        finally:
            torch.set_num_threads(previous)

    def close(self) -> None:
        pass

    def info(self) -> dict[str, Any]:
        return {}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    harness.add_common_args(parser, repeats=("--rounds", 12, "rounds per contender, warm-up included"), warmup=2)
    parser.add_argument("--clients-per-round", type=int, default=20)
    parser.add_argument("--contenders", default=",".join([*EXECUTORS, "wide_t1", "wide_t2"]))
    args = parser.parse_args()
    report = harness.new_report(args, Path(__file__).resolve().parent / "results_vmap.json")
    names = args.contenders.split(",")
    base = [
        "experiment=lora_tiny",
        f"clients_per_round={args.clients_per_round}",
        f"num_rounds={args.rounds + 1}",  # the rounds driven are never the last: no evaluation at all
        f"eval_every={args.rounds + 1}",
        "logger=quiet",
    ]
    with tempfile.TemporaryDirectory() as tmp, harness.busy_machine(args.load) as load:
        contenders: list[Any] = [
            WideContender(n, base, int(n[-1]))
            if n.startswith("wide_t")
            else RunContender(n, [*base, *EXECUTORS[n]], Path(tmp) / n)
            for n in names
        ]
        rows = harness.run_interleaved(contenders, args.rounds, tag="lora")
    report["load"] = load.record()
    params = {name: row.pop("params", None) for name, row in rows.items()}
    summary = {name: harness.summarize(row, args.warmup) for name, row in rows.items()}
    serial = params.get("serial_t1")
    for name, row in summary.items():
        p = params[name]
        if serial is not None and p is not None and name != "serial_t1":
            row["bitwise_equal_serial"] = bool(torch.equal(p, serial))
            row["relative_error_vs_serial"] = float((p - serial).norm() / serial.norm())
    extra = []
    for base_name in ("process_w2", "serial_t1"):
        baseline = summary.get(base_name, {}).get("median_round_s")
        if baseline is None:
            continue
        extra.append((f"x {base_name}", f"speedup_vs_{base_name}"))
        for row in summary.values():
            row[f"speedup_vs_{base_name}"] = harness.ratio(baseline, row.get("median_round_s")) or 0.0
    harness.print_rows(f"experiment=lora_tiny, {args.clients_per_round} clients a round", summary, tuple(extra))
    for name, row in summary.items():
        if "relative_error_vs_serial" in row:
            print(
                f"{name}: relative error vs serial_t1 {row['relative_error_vs_serial']:.2e}, "
                f"bitwise equal: {row['bitwise_equal_serial']}"
            )
    report["results"] = summary
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
