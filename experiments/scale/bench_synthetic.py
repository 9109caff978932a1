"""Time and peak memory of the Synthetic(α, β) generator for 10^3..10^6 devices, the per-device loop against the
chunked one (issue #35).

Every measurement runs in a fresh interpreter (peak RSS only grows within a process): the child imports the
generator, notes its RSS, times one call with issue #35's settings (Synthetic(1, 1), ten examples a device:
``size_mean_log=0 size_sigma_log=0 min_size=9``), and reports the time, its peak RSS and a hash of the returned
arrays. ``old`` is the per-device loop as it was before, kept as the reference in
tests/data/test_synthetic_vectorised.py (run up to 10^5 devices: it grows by about 10 KB a device); ``new`` is
fedsim.data.synthetic. At each size the two run one after the other, and where both run their hashes must agree.

Usage (from the repository root): ``.venv/bin/python experiments/scale/bench_synthetic.py``
(``--sizes 1000 10000`` for fewer sizes, ``--old-up-to`` to change where the old one stops).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
REFERENCE = ROOT / "tests" / "data" / "test_synthetic_vectorised.py"
SETTINGS = {"alpha": 1.0, "beta": 1.0, "size_mean_log": 0.0, "size_sigma_log": 0.0, "min_size": 9}
MIB = 1 << 20


def generator(which: str) -> Any:
    """The new generator, or the reference copy of the old one (imported from the test file by its path)."""
    if which == "new":
        from fedsim.data.synthetic import synthetic

        return synthetic
    spec = importlib.util.spec_from_file_location("reference_synthetic", REFERENCE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return lambda **kwargs: module.reference_synthetic_with_models(**kwargs)[0]


def measure_one(which: str, devices: int) -> dict[str, Any]:
    """In the child: one timed call; RSS in MiB (ru_maxrss is in KiB on Linux)."""
    make = generator(which)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    split = make(num_devices=devices, **SETTINGS)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    digest = hashlib.sha256()
    data_bytes = 0
    for part in (split.train, split.test):
        for array in (part.x.numpy(), part.y.numpy(), part.groups):
            digest.update(array.tobytes())
            data_bytes += array.nbytes
    return {
        "which": which,
        "devices": devices,
        "seconds": seconds,
        "rss_before_mib": before,
        "peak_rss_mib": peak,
        "data_mib": data_bytes / MIB,
        "sha256": digest.hexdigest(),
    }


def run_child(which: str, devices: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--one", which, str(devices)], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{which} at {devices} devices failed: {done.stderr.strip().splitlines()[-1]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def table(results: list[dict[str, Any]]) -> str:
    """One row a size: time, peak RSS and RSS grown during the call (peak less the RSS after the imports)."""
    lines = [
        "| devices | data (MiB) | old: time (s) | old: peak RSS / grown (MiB) | new: time (s) "
        "| new: peak RSS / grown (MiB) | speed-up | same arrays |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for devices in sorted({r["devices"] for r in results}):
        old = next((r for r in results if r["devices"] == devices and r["which"] == "old"), None)
        new = next(r for r in results if r["devices"] == devices and r["which"] == "new")
        cells = [f"{devices:,}", f"{new['data_mib']:.0f}"]
        cells += [f"{old['seconds']:.2f}", memory(old)] if old else ["-", "-"]
        cells += [f"{new['seconds']:.2f}", memory(new)]
        cells += (
            [f"{old['seconds'] / new['seconds']:.1f}×", "yes" if old["sha256"] == new["sha256"] else "NO"]
            if old
            else ["-", "-"]
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def memory(result: dict[str, Any]) -> str:
    return f"{result['peak_rss_mib']:.0f} / {result['peak_rss_mib'] - result['rss_before_mib']:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**3, 10**4, 10**5, 10**6])
    parser.add_argument("--old-up-to", type=int, default=10**5)
    parser.add_argument("--out", type=Path, default=HERE / "results_synthetic.json")
    parser.add_argument("--one", nargs=2, metavar=("WHICH", "DEVICES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one[0], int(args.one[1]))))
        return
    results = []
    for devices in args.sizes:
        for which in ("old", "new") if devices <= args.old_up_to else ("new",):
            results.append(run_child(which, devices))
            print(f"{which} {devices}: {results[-1]['seconds']:.2f} s", file=sys.stderr, flush=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))
    if any(
        r["which"] == "old" and r["sha256"] != n["sha256"]
        for r in results
        for n in results
        if n["devices"] == r["devices"] and n["which"] == "new"
    ):
        raise SystemExit("the old and the new generator returned different arrays")


if __name__ == "__main__":
    main()
