"""fedsim/cli/hydra_mode.py: Hydra is spared its composition for ``hydra.mode`` only where the mode is unset, which
needs fedsim's ``conf/`` never to set it; a command line that sets it, or brings in other configs, goes Hydra's way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_runner import run_cli
from hydra._internal.hydra import Hydra

from fedsim.cli.hydra_mode import mode_is_unset, mode_read_from_the_command_line
from fedsim.cli.run import CONFIG_DIR


def _paths(node: Any, prefix: str) -> set[str]:
    """The dotted path of every mapping key at any depth of a parsed YAML document placed at ``prefix``."""
    if not isinstance(node, dict):
        return set()
    return {p for k, v in node.items() for p in {f"{prefix}{k}", *_paths(v, f"{prefix}{k}.")}}


def _package(path: Path, text: str) -> str:
    """Where Hydra places a config file's keys: its ``# @package`` header, else its group (the folder)."""
    for line in text.splitlines():
        if line.startswith("# @package"):
            header = line.split()[-1]
            return "" if header == "_global_" else f"{header}."
    group = path.parent.relative_to(CONFIG_DIR).as_posix()
    return "" if group == "." else f"{group.replace('/', '.')}."


def test_no_config_file_sets_the_hydra_mode() -> None:
    files = sorted(Path(CONFIG_DIR).rglob("*.yaml"))
    assert len(files) > 100, "conf/ not found"
    setting = [
        str(f) for f in files if "hydra.mode" in _paths(yaml.safe_load(f.read_text()), _package(f, f.read_text()))
    ]
    assert setting == [], f"these set hydra.mode, which fedsim/cli/hydra_mode.py takes as unset: {setting}"
    assert "tracker.mode" in _paths(
        yaml.safe_load((Path(CONFIG_DIR) / "tracker" / "wandb.yaml").read_text()), "tracker."
    )


@pytest.mark.parametrize(
    ("argv", "unset"),
    [
        (["num_rounds=2", "hydra.run.dir=/tmp/x"], True),
        (["-m", "seed=0,1"], True),
        (["--multirun", "seed=0,1"], True),
        (["hydra.mode=MULTIRUN", "seed=0,1"], False),
        (["++hydra.mode=RUN"], False),
        (["~hydra.mode"], False),
        (["+hydra.searchpath=[file:///elsewhere]"], False),
        (["-m", "hydra/sweeper=optuna"], False),
        (["--config-dir", "/elsewhere", "experiment=mine"], False),
        (["--cfg", "job"], False),
    ],
)
def test_which_command_lines_leave_the_mode_unset(argv: list[str], unset: bool) -> None:
    assert mode_is_unset(argv) is unset


def test_hydra_asks_nothing_of_the_config_inside_only_for_an_unset_mode() -> None:
    original = Hydra.get_mode
    with mode_read_from_the_command_line(["num_rounds=1"]):
        assert Hydra.get_mode is not original
        assert Hydra.get_mode(None, "config", ["num_rounds=1"]) is None  # type: ignore[arg-type]
    assert Hydra.get_mode is original
    with mode_read_from_the_command_line(["hydra.mode=MULTIRUN"]):
        assert Hydra.get_mode is original


def test_a_mode_set_on_the_command_line_still_makes_a_sweep(tmp_path: Path) -> None:
    """``hydra.mode=MULTIRUN`` without ``-m``: Hydra reads the mode from the composed configuration and sweeps."""
    done = run_cli(
        [
            "hydra.mode=MULTIRUN",
            "num_rounds=1",
            "data.num_devices=6",
            "clients_per_round=2",
            "logger=quiet",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ]
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "sweep" / "multirun.yaml").exists() and not (tmp_path / "run").exists()
