"""Third-party output goes to run.log and the console keeps fedsim's own lines (fedsim/cli/library_output.py, issue
#41): Python warnings and the records of installed libraries are written to run.log only; fedsim's warnings, Hydra's
lines and the user's own log lines stay on the console. The LoRA runs, whose PEFT and transformers warnings started
this, are in tests/llm/test_lora_console.py."""

from __future__ import annotations

import logging
import sysconfig
import warnings
from pathlib import Path

from cli_runner import run_cli, warnings_on_stderr

from fedsim.cli.library_output import library_output_to_run_log, third_party

USER_STRATEGY = """
import logging
import warnings

from fedsim.strategy import FedAvg


class Noisy(FedAvg):
    def __init__(self) -> None:
        super().__init__()
        warnings.warn("a warning raised while the run is built", UserWarning)
        logging.getLogger("noisy_strategy").warning("the user's own log line")
"""


def _record(name: str, pathname: str) -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, pathname, 1, "message", None, None)


def test_third_party_means_python_warnings_and_installed_code_but_fedsim_and_hydra() -> None:
    site = sysconfig.get_paths()["purelib"]
    stdlib = sysconfig.get_paths()["stdlib"]
    assert third_party(_record("py.warnings", f"{stdlib}/warnings.py"))
    assert third_party(_record("transformers.modeling_utils", f"{site}/transformers/modeling_utils.py"))
    assert third_party(_record("root", f"{site}/somelib/__init__.py"))  # logging.warning() inside a library
    assert third_party(_record("asyncio", f"{stdlib}/asyncio/base_events.py"))
    assert not third_party(_record("fedsim.executor", f"{site}/fedsim/executor/process.py"))  # installed fedsim
    assert not third_party(_record("hydra.core.utils", f"{site}/hydra/core/utils.py"))
    assert not third_party(_record("my_strategies", "/home/someone/project/my_strategies.py"))


def test_the_console_keeps_fedsim_and_user_lines_and_run_log_gets_the_warning(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "noisy_strategy.py").write_text(USER_STRATEGY)
    run_dir = tmp_path / "run"
    with warnings_on_stderr():
        done = run_cli(
            [
                "strategy._target_=noisy_strategy.Noisy",
                "num_rounds=1",
                "clients_per_round=2",
                "data.num_devices=4",
                "stragglers.fraction=0.5",  # a warning of fedsim's own: one local epoch has nothing to cut
                "logger=quiet",
                f"hydra.run.dir={run_dir}",
            ],
            pythonpath=[tmp_path / "code"],
        )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert len(lines) == 3, done.stdout
    assert "[noisy_strategy][WARNING] - the user's own log line" in lines[0]
    assert "[fedsim][WARNING] - stragglers.fraction=0.5 has no effect" in lines[1]
    assert lines[2].startswith("final test accuracy: ")
    log = (run_dir / "run.log").read_text()
    assert "[py.warnings][WARNING] - " in log and "UserWarning: a warning raised while the run is built" in log
    assert "stragglers.fraction=0.5 has no effect" in log and "the user's own log line" in log


def test_everything_is_put_back_on_leaving() -> None:
    root = logging.getLogger()
    console = logging.StreamHandler()
    root.addHandler(console)
    showwarning = warnings.showwarning
    try:
        with library_output_to_run_log():
            assert console.filters and warnings.showwarning is not showwarning
        assert not console.filters and warnings.showwarning is showwarning
    finally:
        root.removeHandler(console)
