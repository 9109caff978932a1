"""What a process worker imports (the forkserver's preload, fedsim/executor/process/preload.py) stays free of what
only the main process needs: Hydra and OmegaConf (about 0.1 s and 160 modules, paid by every run's forkserver before
its workers are ready) and the optional extras, which a worker must not need to have installed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

MAIN_PROCESS_ONLY = ("hydra", "omegaconf", "fedsim.cli.config", "fedsim.cli.run", "fedsim.cli.command")
EXTRAS = ("ray", "dp_accounting", "datasets", "h5py", "mlflow", "wandb", "matplotlib")

PROBE = "import json, sys; import fedsim.executor.process.preload; print(json.dumps(sorted(sys.modules)))"


@pytest.mark.slow
def test_the_worker_preload_imports_neither_hydra_nor_any_extra() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    modules = set(json.loads(done.stdout))
    assert "torch" in modules and "fedsim.executor.process.worker" in modules  # what the preload is for
    assert [m for m in MAIN_PROCESS_ONLY + EXTRAS if m in modules] == []


def test_python_m_fedsim_starts_the_forkserver_before_importing_torch() -> None:
    """``python -m fedsim executor=process`` imports forkserver.py to start the workers' forkserver first, so that
    the forkserver's imports (torch, fedsim, ~6 CPU s) run beside the main process's own instead of after them: the
    package ``__init__`` modules above it must not import torch or an executor."""
    probe = "import json, sys; import fedsim.executor.process.forkserver; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    modules = set(json.loads(done.stdout))
    assert "torch" not in modules and "fedsim.executor.process.executor" not in modules
