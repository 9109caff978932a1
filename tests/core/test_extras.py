"""A missing optional package (an extra) stops a run before any work, in one line that says what to install,
the same way for every extra; a package that is installed but fails to import says so."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from cli_runner import run_cli

from fedsim.cli.config import ConfigError
from fedsim.core.extras import MissingExtraError, missing_text, require

# case -> (overrides, the module made missing, the line's start, the extra)
CASES = {
    "ray": (["executor=ray"], "ray", "executor=ray", "ray"),
    "central_dp": (["dp=central"], "dp_accounting", "the privacy accountant", "dp"),
    "local_dp": (["client=dpsgd"], "dp_accounting", "the privacy accountant", "dp"),
    "wandb": (["tracker=wandb"], "wandb", "tracker=wandb", "wandb"),
}


@pytest.mark.slow  # the first case pays the command line's imports (Hydra, torch)
@pytest.mark.parametrize("case", list(CASES))
def test_a_missing_extra_stops_the_run_in_one_line_before_any_work(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fedsim ARGS`` with one package missing, as if it were not installed (``None`` in ``sys.modules``: any
    import of it fails, whether or not this process imported it before; every extra is imported through
    :func:`require`, at each call)."""
    overrides, module, needed_by, extra = CASES[case]
    monkeypatch.setitem(sys.modules, module, None)
    run_dir = tmp_path / "run"
    proc = run_cli([*overrides, "num_rounds=1", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
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
