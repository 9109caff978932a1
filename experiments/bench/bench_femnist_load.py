"""Loading full-size FEMNIST into fedsim's clients: seconds and peak memory against the raw arrays' bytes.

Issue #17's target: "takes seconds and its memory is within 1.3x of the raw arrays". The data is a synthetic
stand-in of FEMNIST at full size (LEAF's statistics: 3,550 writers, 805,263 images, 227 ± 89 per writer):
``--writers`` (3,500) writers with gamma-distributed sizes (mean 229, sd 89, at least 20), each writer's
examples split 90/10 into its own train and test rows (TFF's files hold about 10 % test), 28x28 float32
images (random values; nothing depends on them), 62 classes. Raw arrays = every image (float32) + every
label (int64): about 2.5 GB.

Paths, each run in a fresh subprocess (``--repeats`` times) so that its peak RSS (``VmHWM`` from
/proc/self/status, what the kernel records as the process's largest resident set) is its own:

* ``alloc_floor``    not a loader: ``torch.empty`` of the raw arrays' shapes, zero-filled. The cost of
                     faulting in that much fresh memory, a floor for any loader that reads into new tensors
                     (on a VM whose page faults are slow, or when transparent huge pages are not available,
                     it is seconds by itself).
* ``arrays``         ``DataSplit.from_arrays(x_train, y_train, x_test, y_test, client_ids=...)`` with numpy
                     arrays already in memory (made untimed in the child; they count in its peak, as they would
                     in yours), ``federate(partition=natural, client_test_fraction=0.1)``, ``make_clients``:
                     the writers' test rows form the centralized test set, each client's local test is cut
                     from its training rows.
* ``arrays_pooled``  the same with ``test_client_ids=...`` too, so every writer tests on its own test rows;
                     ``from_arrays`` then concatenates both parts into one pool tensor (a copy).
* ``pool``           ``DataSplit.from_pool(x, y, client_ids=..., test_mask=...)``: the same federation as
                     ``arrays_pooled`` from arrays that already hold every row once (each writer's train rows,
                     then its test rows: the mask is not a tail, so the centralized test set is a copy of the
                     test rows, about 10 %); no copy of the pool.
* ``tff_h5``         ``fedsim.data.tff.femnist_tff`` on a TFF-format HDF5 pair (``fed_emnist_{train,test}.h5``,
                     ``examples/<writer>/{pixels,label}``) written once to ``--tmpdir`` before timing (free disk
                     checked first), then ``federate(partition=natural)`` and ``make_clients``. The file was just
                     written, so it is read from the page cache: a cold read adds the disk's time.

Reported per path: seconds to load (``from_arrays`` / ``femnist_tff``), to federate and to make the clients
(their sum is the target's "seconds"), the peak RSS / raw bytes, and (peak − the RSS before any data existed,
i.e. Python + torch + fedsim) / raw bytes. Results go to ``results_femnist_load.json`` (with machine and the
fedsim sources' hash; no git) and a table.

Run from the repository root (needs h5py and ~2.6 GB free under --tmpdir; about 2 minutes on 2 cores)::

    .venv/bin/python experiments/bench/bench_femnist_load.py
    .venv/bin/python experiments/bench/bench_femnist_load.py --quick          # 350 writers: smoke run, not kept
    .venv/bin/python experiments/bench/bench_femnist_load.py --paths tff_h5 --tmpdir /data/tmp
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (machine, result files, --load)

PATHS = ("alloc_floor", "arrays", "arrays_pooled", "pool", "tff_h5")
IMAGE = (28, 28)
NUM_CLASSES = 62
TARGET_RATIO = 1.3


# --------------------------------------------------------------------------------------------------
# the synthetic stand-in


def writer_sizes(writers: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per writer: (train rows, test rows). Sizes ~ gamma(mean 229, sd 89), at least 20; 10 % test (≥ 1)."""
    rng = np.random.default_rng(seed)
    mean, sd = 229.0, 89.0
    sizes = np.maximum(np.rint(rng.gamma((mean / sd) ** 2, sd**2 / mean, writers)), 20).astype(np.int64)
    test = np.maximum(np.rint(0.1 * sizes), 1).astype(np.int64)
    return sizes - test, test


def raw_bytes(train: np.ndarray, test: np.ndarray) -> int:
    rows = int(train.sum() + test.sum())
    return rows * (int(np.prod(IMAGE)) * 4 + 8)


def make_arrays(sizes: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Images (float32, filled in place: no temporaries), labels and the writer of every row."""
    n = int(sizes.sum())
    x = np.empty((n, 1, *IMAGE), dtype=np.float32)
    rng.random(out=x.reshape(n, -1), dtype=np.float32)
    y = rng.integers(0, NUM_CLASSES, n)
    return x, y, np.repeat(np.arange(len(sizes)), sizes)


def write_h5(folder: Path, train: np.ndarray, test: np.ndarray, seed: int) -> None:
    """The TFF pair ``fed_emnist_{train,test}.h5``: ``examples/<id>/pixels`` (float32) and ``label`` (int32)."""
    import h5py

    rng = np.random.default_rng(seed)
    ids = [f"f{i:04d}_{i % 100:02d}" for i in range(len(train))]
    for part, sizes in (("train", train), ("test", test)):
        with h5py.File(folder / f"fed_emnist_{part}.h5", "w") as f:
            examples = f.create_group("examples")
            for cid, n in zip(ids, sizes, strict=True):
                group = examples.create_group(cid)
                group["pixels"] = rng.random((int(n), *IMAGE), dtype=np.float32)
                group["label"] = rng.integers(0, NUM_CLASSES, int(n)).astype(np.int32)


# --------------------------------------------------------------------------------------------------
# one measurement, in a fresh process


def _status_kb(key: str) -> int:
    line = next(v for v in Path("/proc/self/status").read_text().splitlines() if v.startswith(key + ":"))
    return int(line.split()[1]) * 1024


def child(path: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Load, federate and make clients along ``path``; times and memory as a dict (printed as JSON)."""
    from fedsim.client import Client
    from fedsim.client.federation import federate, make_clients
    from fedsim.data.partition import natural
    from fedsim.data.tensor_data import DataSplit
    from fedsim.data.tff import femnist_tff

    train, test = np.array(spec["train"]), np.array(spec["test"])
    base_rss = _status_kb("VmRSS")
    if path == "alloc_floor":
        return _alloc_floor(int(train.sum() + test.sum()), base_rss)
    if path == "tff_h5":
        start = time.perf_counter()
        split = femnist_tff(root=spec["h5_dir"])
    elif path == "pool":
        rng = np.random.default_rng(spec["seed"])
        x, y, owners = make_arrays(train + test, rng)
        is_test = np.arange(len(y)) - np.repeat(np.cumsum(train + test) - (train + test), train + test) >= np.repeat(
            train, train + test
        )
        start = time.perf_counter()
        split = DataSplit.from_pool(x, y, client_ids=owners, test_mask=is_test, num_classes=NUM_CLASSES)
    else:
        rng = np.random.default_rng(spec["seed"])
        x_tr, y_tr, g_tr = make_arrays(train, rng)
        x_te, y_te, g_te = make_arrays(test, rng)
        extra = {"test_client_ids": g_te} if path == "arrays_pooled" else {}
        start = time.perf_counter()
        split = DataSplit.from_arrays(x_tr, y_tr, x_te, y_te, num_classes=NUM_CLASSES, client_ids=g_tr, **extra)
    loaded = time.perf_counter()
    data = federate(split, natural, client_test_fraction=0.1, seed=0)
    federated = time.perf_counter()
    clients = make_clients(data, Client)
    done = time.perf_counter()
    return {
        "load_s": loaded - start,
        "federate_s": federated - loaded,
        "clients_s": done - federated,
        "total_s": done - start,
        "peak_rss_bytes": _status_kb("VmHWM"),
        "base_rss_bytes": base_rss,
        "clients": len(clients),
        "train_rows": sum(c.num_train for c in clients),
        "local_test_rows": sum(len(c.test_indices) for c in clients),
        "central_test_rows": len(split.test),
    }


def _alloc_floor(rows: int, base_rss: int) -> dict[str, Any]:
    """Time to allocate and touch the raw arrays' bytes as tensors (what every fresh load pays at least)."""
    import torch

    start = time.perf_counter()
    x = torch.empty((rows, 1, *IMAGE), dtype=torch.float32).zero_()
    y = torch.empty(rows, dtype=torch.int64).zero_()
    done = time.perf_counter()
    assert x.shape[0] == y.shape[0]
    return {
        "load_s": done - start,
        "federate_s": 0.0,
        "clients_s": 0.0,
        "total_s": done - start,
        "peak_rss_bytes": _status_kb("VmHWM"),
        "base_rss_bytes": base_rss,
        "clients": 0,
        "train_rows": rows,
        "local_test_rows": 0,
        "central_test_rows": 0,
    }


def measure(path: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Run ``child`` in a fresh interpreter and return its result."""
    cmd = [sys.executable, __file__, "--child", path, "--spec", json.dumps(spec)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{path} child failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------------
# driver


def summarize(runs: list[dict[str, Any]], raw: int) -> dict[str, Any]:
    best = min(runs, key=lambda r: r["total_s"])
    peak = max(r["peak_rss_bytes"] for r in runs)
    base = min(r["base_rss_bytes"] for r in runs)
    return {
        "runs": runs,
        "best": best,
        "min_total_s": best["total_s"],
        "peak_rss_bytes": peak,
        "peak_over_raw": peak / raw,
        "peak_minus_base_over_raw": (peak - base) / raw,
        "within_target": peak / raw <= TARGET_RATIO,
    }


def print_table(rows: dict[str, dict[str, Any]], raw: int) -> None:
    print(f"\n== FEMNIST-size load: raw arrays {raw / 2**30:.2f} GiB; target: seconds, peak <= {TARGET_RATIO}x raw")
    print(
        f"{'path':<15}{'load s':>9}{'federate s':>12}{'clients s':>11}{'total s':>9}{'peak GiB':>10}"
        f"{'peak/raw':>10}{'(peak-base)/raw':>17}{'clients':>9}"
    )
    for name, row in rows.items():
        b = row["best"]
        print(
            f"{name:<15}{b['load_s']:>9.2f}{b['federate_s']:>12.2f}{b['clients_s']:>11.2f}{b['total_s']:>9.2f}"
            f"{row['peak_rss_bytes'] / 2**30:>10.2f}{row['peak_over_raw']:>10.2f}"
            f"{row['peak_minus_base_over_raw']:>17.2f}"
            f"{b['clients']:>9}"
        )


def prepare_h5(folder: Path, train: np.ndarray, test: np.ndarray, seed: int) -> float:
    """Write the HDF5 pair after checking free disk; returns the seconds it took."""
    need = raw_bytes(train, test) * 1.1 + 2**30
    free = shutil.disk_usage(folder).free
    if free < need:
        sys.exit(
            f"bench_femnist_load: {folder} has {free / 2**30:.1f} GiB free, needs {need / 2**30:.1f}; use --tmpdir"
        )
    start = time.perf_counter()
    write_h5(folder, train, test, seed)
    return time.perf_counter() - start


def fingerprint() -> dict[str, Any]:
    """The fedsim sources measured, by content (no git: the tree is shared with other jobs)."""
    root = harness.HERE.parents[1] / "fedsim"
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(root.rglob("*.py"))))
    return {"fedsim_sha256": digest.hexdigest()[:16]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset of: " + ",".join(PATHS))
    p.add_argument("--writers", type=int, default=3500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tmpdir", type=Path, default=None, help="where the HDF5 pair is written (default: the system's)")
    p.add_argument("--quick", action="store_true", help="smoke run: 350 writers, one repeat, results not kept")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    harness.add_common_args(
        p, repeats=("--repeats", 2, "fresh subprocesses per path (the fastest is shown)"), warmup=None, quiet_wait=0.0
    )
    args = p.parse_args(argv)
    if args.quick:
        args.writers, args.repeats = 350, 1
        args.out = args.out or Path(tempfile.gettempdir()) / "results_femnist_load_quick.json"
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, json.loads(args.spec))))
        return
    harness.code_version = fingerprint
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        **harness.new_report(args, harness.HERE / "results_femnist_load.json"),
    }
    train, test = writer_sizes(args.writers, args.seed)
    raw = raw_bytes(train, test)
    report["workload"] = {
        "writers": args.writers,
        "train_rows": int(train.sum()),
        "test_rows": int(test.sum()),
        "min_rows": int((train + test).min()),
        "max_rows": int((train + test).max()),
        "raw_bytes": raw,
        "target_ratio": TARGET_RATIO,
    }
    spec = {"train": train.tolist(), "test": test.tolist(), "seed": args.seed}
    rows: dict[str, dict[str, Any]] = {}
    with (
        tempfile.TemporaryDirectory(dir=args.tmpdir, prefix="femnist_h5_") as tmp,
        harness.busy_machine(args.load) as load,
    ):
        for path in args.paths.split(","):
            if path == "tff_h5":
                report["workload"]["h5_write_s"] = prepare_h5(Path(tmp), train, test, args.seed)
                spec["h5_dir"] = tmp
            print(f"[{path}] {args.repeats} fresh run(s)", file=sys.stderr, flush=True)
            rows[path] = summarize([measure(path, spec) for _ in range(args.repeats)], raw)
    report["paths"], report["load"] = rows, load.record()
    print_table(rows, raw)
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
