"""A non-editable install carries conf/ with it: `python -m fedsim` works outside the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_non_editable_install_finds_its_configs(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    # from a copy: a non-editable install builds in <source>/build, which must not be the checkout's (its files
    # would outlive the test, and a later build would pack stale modules)
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", "outputs"),
    )
    # --ignore-installed: without it pip first uninstalls the fedsim this interpreter already has (the
    # editable install of the checkout), breaking the environment the rest of the suite runs in
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--ignore-installed",
            "--disable-pip-version-check",
            "--prefix",
            str(prefix),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    site = Path(sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)}))
    assert (site / "fedsim" / "run.py").exists() and (
        prefix / "share" / "fedsim" / "conf" / "executor" / "vmap.yaml"
    ).exists()
    env = {**os.environ, "PYTHONPATH": str(site)}
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "fedsim", "num_rounds=1", "logger=quiet", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "final test accuracy" in proc.stdout and (run_dir / "summary.json").exists()
    where = subprocess.run(
        [sys.executable, "-c", "import fedsim.cli.run as r; print(r.CONFIG_DIR)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert Path(where.stdout.strip()) == prefix / "share" / "fedsim" / "conf", where.stderr[-2000:]


def test_every_config_group_is_listed_for_the_non_editable_install() -> None:
    """A config group missing from setup.cfg's data_files exists in a checkout and vanishes from an install."""
    import configparser

    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    listed = {key.removeprefix("share/fedsim/conf").strip("/") for key in parser["options.data_files"]}
    groups = {path.name for path in (ROOT / "conf").iterdir() if path.is_dir()}
    assert groups - listed == set(), "add these conf/ groups to [options.data_files] in setup.cfg"
