"""The numbers in README.md: Ditto's personal models against the global model on the clients' own test splits.

Runs ``python -m fedsim`` (the default experiment: Synthetic(1,1), logistic regression, 10 of 30 clients per
round, 30 rounds) once per setting, as a user would, and summarises each run's ``metrics.jsonl`` over its last
10 rounds. Run from the repository root:

    .venv/bin/python experiments/ditto/measure.py            # writes experiments/ditto/results.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SETTINGS: dict[str, list[str]] = {
    "lam=0 (local only)": ["+client.lam=0"],
    "lam=0.1": ["+client.lam=0.1"],
    "lam=1": ["+client.lam=1"],
    "lam=10": ["+client.lam=10"],
    "lam=0.1, personal_epochs=3": ["+client.lam=0.1", "+client.personal_epochs=3"],
}
LAST = 10


def run(overrides: list[str], run_dir: Path) -> list[dict[str, Any]]:
    """One fedsim run with DittoClient; its metrics records."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in ("experiments/ditto", os.environ.get("PYTHONPATH", "")) if p),
    }
    cmd = [
        sys.executable,
        "-m",
        "fedsim",
        "client._target_=ditto.DittoClient",
        *overrides,
        "logger=quiet",
        f"hydra.run.dir={run_dir}",
    ]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summarise(records: list[dict[str, Any]]) -> dict[str, float]:
    """Means over the last rounds; the personal accuracy of the 10% worst client updates in them."""
    last = records[-LAST:]
    personal = [
        c["metrics"]["personal_accuracy"]
        for r in last
        for c in r["clients"]
        if "personal_accuracy" in c.get("metrics", {})
    ]
    mean = lambda key: float(np.mean([r[key] for r in last]))  # noqa: E731
    return {
        "global_client_accuracy": mean("eval_global/accuracy"),
        "personal_accuracy": mean("fit/personal_accuracy"),
        "personal_accuracy_p10": float(np.percentile(personal, 10)),
        "global_client_loss": mean("eval_global/loss"),
        "personal_loss": mean("fit/personal_loss"),
        "final_test_accuracy": records[-1]["eval/accuracy"],
    }


def main() -> None:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, overrides) in enumerate(SETTINGS.items()):
            results[name] = summarise(run(overrides, Path(tmp) / str(i)))
            print(name, {k: round(v, 4) for k, v in results[name].items()}, flush=True)
    (Path(__file__).parent / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
