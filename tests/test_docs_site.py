"""The API reference site (mkdocs.yml, docs/reference/): what it documents has docstrings, it lists every export.

`.ci/run` builds the site with ``mkdocs build --strict``; mkdocstrings renders a public name without a docstring
silently, so this test is what keeps every documented class, function and method explained.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import logging
import re
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

import fedsim

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "reference"
DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", re.MULTILINE)


def documented_modules() -> list[str]:
    """The modules the reference pages render (each page's ``::: module`` lines)."""
    return sorted({m for page in REFERENCE.glob("*.md") for m in DIRECTIVE.findall(page.read_text())})


def public_names(module: ModuleType) -> list[str]:
    """``__all__`` where the module defines it, else the public names defined in the module itself."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__ == module.__name__
    ]


def undocumented_members(cls: type) -> list[str]:
    """The public methods and properties that ``cls`` itself defines with no docstring, also not one inherited
    from the method it overrides (whose docstring then describes it)."""
    missing = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        target = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
        if not inspect.isfunction(target):
            continue
        if not inspect.getdoc(getattr(cls, name) if not isinstance(value, property) else value):
            missing.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    return missing


def own_docstring(value: Any) -> bool:
    """Whether a class or function has a docstring of its own (a dataclass without one gets its signature)."""
    doc = (value.__doc__ or "").strip()
    return bool(doc) and not (dataclasses.is_dataclass(value) and doc.startswith(f"{value.__name__}("))


def undocumented(module_name: str) -> list[str]:
    """Every public class, function and method of the module that has no docstring."""
    module = importlib.import_module(module_name)
    missing = []
    for name in public_names(module):
        value = getattr(module, name)
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue  # constants and type aliases
        if not own_docstring(value):
            missing.append(f"{module_name}.{name}")
        if inspect.isclass(value):
            missing += undocumented_members(value)
    return missing


def test_the_reference_pages_render_the_public_api() -> None:
    modules = documented_modules()
    for required in ["fedsim", "fedsim.strategy", "fedsim.executor", "fedsim.client", "fedsim.server"]:
        assert required in modules, f"docs/reference/ has no '::: {required}'"
    assert any(m.startswith("fedsim.data.") for m in modules)


@pytest.mark.parametrize("module_name", documented_modules())
def test_every_documented_name_has_a_docstring(module_name: str) -> None:
    missing = sorted(set(undocumented(module_name)))
    assert not missing, "no docstring (the API reference shows them): " + ", ".join(missing)


def test_every_top_level_export_is_on_the_reference_page() -> None:
    page = (REFERENCE / "fedsim.md").read_text()
    absent = [name for name in fedsim.__all__ if f"[`{name}`]" not in page]
    assert not absent, f"docs/reference/fedsim.md does not list {absent}"


def load_hook() -> Any:
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def render(markdown: str) -> str:
    page = SimpleNamespace(file=SimpleNamespace(src_path="guide.md"))
    result: str = load_hook().on_page_markdown(markdown, page, {"docs_dir": str(REPO / "docs")}, None)
    return result


def test_a_link_out_of_docs_becomes_its_repository_path() -> None:
    assert render("see [its README](../experiments/faults/README.md#x).") == (
        "see its README (`experiments/faults/README.md`)."
    )
    assert render("[`setup.cfg`](../setup.cfg)") == "`setup.cfg`"
    assert render("[a page](quickstart.md#errors)") == "[a page](quickstart.md#errors)"
    assert render("```\n[code](../nothing-here)\n```") == "```\n[code](../nothing-here)\n```"


def test_a_link_out_of_docs_to_a_missing_file_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.outside_links"):
        render("[gone](../experiments/no_such_experiment)")
    assert [r.getMessage() for r in caplog.records] == [
        "Doc file 'guide.md' links to '../experiments/no_such_experiment', which is not in the repository "
        "(experiments/no_such_experiment)."
    ]


def test_sphinx_roles_in_rendered_docstrings_become_plain_code() -> None:
    html = "see :meth:<code>~fedsim.strategy.Strategy.setup</code> and :class:<code>Server</code>, not a:b:<code>"
    assert load_hook().on_page_content(html, None, None, None) == (
        "see <code>setup</code> and <code>Server</code>, not a:b:<code>"
    )


# where a guide, a README, a script, a docstring or a test names a test file or folder (tests/core/test_checks.py,
# tests/executor/ray, or one test: PATH::NAME); a pattern (test_<name>.py, test_fedbuff*.py) is no path
TESTS_PATH = re.compile(r"(?<![\w./-])(tests/[\w/.<>*-]*[\w<>*])(?:::(\w+))?")
NAMING_TESTS = ["README.md", "CONTRIBUTING.md", ".ci/run", "docs/**/*.md", "docs/**/*.ipynb", "conf/**/*.yaml"]
NAMING_TESTS += ["experiments/**/*.*", "fedsim/**/*.py", "tests/**/*.py"]
TEXT = {"", ".md", ".ipynb", ".yaml", ".py", ".sh", ".txt"}


def named_test_paths() -> set[tuple[str, str, str | None]]:
    """(the naming file, the path, the test function after ``::`` or None) for every path under tests/ named."""
    files = {p for pattern in NAMING_TESTS for p in REPO.glob(pattern) if p.is_file() and p.suffix in TEXT}
    named = set()
    for path in files:
        for m in TESTS_PATH.finditer(path.read_text(errors="replace")):
            if not any(c in m.group(1) for c in "<>*"):
                named.add((path.relative_to(REPO).as_posix(), m.group(1), m.group(2)))
    return named


def test_every_test_file_the_docs_and_code_name_exists() -> None:
    """The test folders mirror the packages (CONTRIBUTING.md, "Writing tests"): a test file that moves leaves no
    stale path in a guide, a README or a docstring, and a ``file::test`` names a test that is there."""
    named = named_test_paths()
    assert len(named) > 100  # the files were read
    missing = sorted(f"{src}: {path}" for src, path, _ in named if not (REPO / path).exists())
    assert not missing, f"paths under tests/ that do not exist: {missing}"
    gone = sorted(
        f"{src}: {path}::{test}"
        for src, path, test in named
        if test and not re.search(rf"^(async )?def {test}\(", (REPO / path).read_text(), re.MULTILINE)
    )
    assert not gone, f"tests that are not in the file named: {gone}"
