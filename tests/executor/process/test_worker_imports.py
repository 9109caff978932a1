"""What a process worker imports (the forkserver's preload, fedsim/executor/process/preload.py) stays free of what
only the main process needs: Hydra and OmegaConf (about 0.1 s and 160 modules, paid by every run's forkserver before
its workers are ready) and the optional extras, which a worker must not need to have installed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


def test_the_command_line_is_read_for_its_model_without_importing_torch_or_hydra() -> None:
    """What ``python -m fedsim`` reads before it starts the forkserver (fedsim/cli/config_dir.py) stays cheap."""
    probe = "import json, sys; import fedsim.cli.config_dir; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [m for m in ("torch", "hydra", "omegaconf", "yaml") if m in set(json.loads(done.stdout))] == []


HF_PROBE = """
import sys
from fedsim.executor.process.forkserver import start_early

def main():
    import multiprocessing
    start_early(["executor=process", "experiment=lora_tiny"], hf_model=True)
    queue = multiprocessing.get_context("forkserver").SimpleQueue()
    worker = multiprocessing.get_context("forkserver").Process(target=report, args=(queue,))
    worker.start()
    print(queue.get())
    worker.join()

def report(queue):
    queue.put(sorted(m for m in ("transformers.models.gpt2.modeling_gpt2", "peft.tuners.lora") if m in sys.modules))

if __name__ == "__main__":
    main()
"""


@pytest.mark.slow
def test_a_hugging_face_run_has_its_workers_forked_with_transformers_and_peft_imported(tmp_path: Path) -> None:
    """With ``hf_model`` (``python -m fedsim experiment=lora_tiny executor=process``), a worker starts with what
    building the model needs already imported (preload_hf.py): ~3.5 CPU s each worker no longer spends."""
    pytest.importorskip("peft")
    script = tmp_path / "probe.py"
    script.write_text(HF_PROBE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['peft.tuners.lora', 'transformers.models.gpt2.modeling_gpt2']"
