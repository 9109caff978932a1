"""A missing optional package (an extra) stops a run before any work, in one line that says what to install,
the same way for every extra; a package that is installed but fails to import says so."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fedsim.cli.config import ConfigError
from fedsim.core.extras import MissingExtraError, missing_text, require

REPO = Path(__file__).resolve().parents[2]

# case -> (overrides, the module made missing, the line's start, the extra)
CASES = {
    "ray": (["executor=ray"], "ray", "executor=ray", "ray"),
    "central_dp": (["dp=central"], "dp_accounting", "the privacy accountant", "dp"),
    "local_dp": (["client=dpsgd"], "dp_accounting", "the privacy accountant", "dp"),
    "wandb": (["tracker=wandb"], "wandb", "tracker=wandb", "wandb"),
}

# `python -m fedsim ARGS` with one package missing, as if it were not installed
WITHOUT = (
    "import runpy, sys; sys.modules[{module!r}] = None; sys.argv = ['fedsim', *{args!r}]; "
    "runpy.run_module('fedsim', run_name='__main__')"
)


def _run_without(module: str, overrides: list[str], run_dir: Path) -> subprocess.CompletedProcess[str]:
    args = [*overrides, "num_rounds=1", f"hydra.run.dir={run_dir}"]
    return subprocess.run(
        [sys.executable, "-c", WITHOUT.format(module=module, args=args)],
        cwd=run_dir.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    base = tmp_path_factory.mktemp("extras")
    for name in CASES:
        (base / name).mkdir()
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {
            name: pool.submit(_run_without, module, overrides, base / name / "run")
            for name, (overrides, module, _, _) in CASES.items()
        }
        return {name: (future.result(), base / name / "run") for name, future in futures.items()}


@pytest.mark.slow  # four fresh interpreters that import torch
@pytest.mark.parametrize("case", list(CASES))
def test_a_missing_extra_stops_the_run_in_one_line_before_any_work(case: str, runs: dict) -> None:
    proc, run_dir = runs[case]
    _, module, needed_by, extra = CASES[case]
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"fedsim: error: {needed_by}"), lines[0]
    assert f"pip install 'fedsim-torch[{extra}]'" in lines[0]
    assert not (run_dir / "metrics.jsonl").exists() and not list(run_dir.glob("checkpoints/*"))


def test_require_names_the_feature_the_package_and_the_extra() -> None:
    with pytest.raises(MissingExtraError) as caught:
        require("fedsim_test_no_such_package", "executor=nothing", "nothing", package="no-such-package")
    assert (
        str(caught.value)
        == missing_text("executor=nothing", "no-such-package", "nothing")
        == (
            "executor=nothing needs the no-such-package package: "
            "pip install 'fedsim-torch[nothing]' (in a source checkout: pip install -e '.[nothing]'; "
            "or pip install no-such-package)"
        )
    )
    assert isinstance(caught.value, ConfigError) and isinstance(caught.value, ImportError)


def test_an_installed_package_that_fails_to_import_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real package on the path whose own import fails (a dependency it needs is missing): the line says the
    package is installed and gives Python's reason, rather than telling the user to install it again."""
    package = tmp_path / "fedsim_test_broken_extra"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent("""
        import fedsim_test_absent_dependency  # noqa: F401
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        MissingExtraError, match="it is installed but does not import: No module named 'fedsim_test_absent_dependency'"
    ):
        require("fedsim_test_broken_extra", "tracker=broken", "broken")
