"""A worker killed every second, replacements and starting workers included, never hangs the run: it ends
bitwise equal to serial or stops with one line, and leaves no process behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from own_processes import live_tagged, new_tag, tagged_environment

SCRIPT = Path(__file__).parents[3] / "experiments" / "faults" / "kill_loop.py"


@pytest.mark.slow
def test_killing_a_worker_every_second_never_hangs() -> None:
    """Five kills, one every half second, of a 20-round run: the run ends bitwise equal to serial or with one line,
    and none of the processes it started (tagged through their environment) outlives it."""
    tag = new_tag()
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--repeats", "1", "--kills", "5", "--interval", "0.5", "--rounds", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=tagged_environment(tag),
    )
    try:
        out, err = proc.communicate(timeout=240)  # a hang fails here
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    [line] = [json.loads(text) for text in out.splitlines() if text.startswith("{")]
    assert line["kills"] == 5, line
    assert line["outcome"] == "bitwise equal to serial" or line["outcome"].startswith("stopped with one line"), line
    deadline = time.monotonic() + 10
    while live_tagged(tag) and time.monotonic() < deadline:  # a killed worker's pool may take a moment to exit
        time.sleep(0.2)
    assert not live_tagged(tag), "no worker outlives the run"


@pytest.mark.slow
def test_a_worker_killed_while_reading_its_start_message_is_started_again(tmp_path: Path) -> None:
    """Before: the ~190 KB start payload went through multiprocessing's spawn pipe, of which the parent holds
    both ends; a worker killed while reading it left the parent blocked in write() for good."""
    code = f"""
import functools, os, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import numpy as np, torch
from fedsim.client.base import Client
from fedsim.data.tensor_data import TensorData
from fedsim.executor import ProcessExecutor, SerialExecutor
from fedsim.observe.run_logger import RunLogger
from fedsim.server import Federation, Schedule, Server
from fedsim.strategy import FedAvg

def run(executor):
    import dies_on_import  # the parent's import; a worker imports it while unpickling its start message
    g = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(400, 8, generator=g), torch.randint(0, 3, (400,), generator=g), 3)
    # a large start message
    clients = [Client(i, np.arange(i % 400, i % 400 + 1) % 400, epochs=1, batch_size=1) for i in range(4000)]
    return Server(model_factory=functools.partial(dies_on_import.linear, (8,), 3),
                  federation=Federation(clients, data, None), strategy=FedAvg(), executor=executor,
                  schedule=Schedule(num_rounds=2, clients_per_round=4), seed=0,
                  logger=RunLogger(None, tensorboard=False, progress=False)).run().params

if __name__ == "__main__":
    os.environ["FEDSIM_TEST_PARENT"] = str(os.getpid())
    process = run(ProcessExecutor(devices="cpu", workers=1, start_timeout_s=60))
    print("equal" if torch.equal(process, run(SerialExecutor())) else "different")
"""
    script = tmp_path / "start.py"
    script.write_text(code)
    marker = tmp_path / "died"
    env = {**os.environ, "FEDSIM_TEST_DIE_MARKER": str(marker)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert marker.exists(), "the first worker must have died while reading its start message"
    assert done.stdout.strip().splitlines()[-1] == "equal"
    assert "was killed by SIGKILL" in done.stderr and "starting it again" in done.stderr
