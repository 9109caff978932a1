"""The shape of the package that docs/architecture.md draws: no import circles between fedsim's modules (imports
under ``TYPE_CHECKING`` and inside functions included, as grimp reads them), and at most 10 modules directly under
``fedsim/``. The layers and independence contracts themselves are checked by ``lint-imports`` (pyproject.toml)."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import re
from pathlib import Path

import grimp
import pytest

import fedsim

PACKAGE_DIR = Path(fedsim.__file__).parent


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_fedsim_imports_itself_through_others() -> None:
    graph = grimp.build_graph("fedsim")
    modules = {m for m in graph.modules if m == "fedsim" or m.startswith("fedsim.")}
    edges = {m: set(graph.find_modules_directly_imported_by(m)) & modules for m in modules}
    assert sum(len(targets) for targets in edges.values()) > 300  # the graph was read (463 imports today)
    assert _cycles(edges) == []


def test_at_most_ten_modules_sit_directly_under_fedsim() -> None:
    top = sorted(p.name for p in PACKAGE_DIR.glob("*.py"))
    assert len(top) <= 10, top


def test_nothing_in_fedsim_imports_the_executor_s_kept_path() -> None:
    """``fedsim.executor.ray_warm`` is kept for researchers' code only; the contract on the other thin re-exports
    (pyproject.toml) cannot see imports from inside ``fedsim.executor``, its own package."""
    graph = grimp.build_graph("fedsim")
    assert graph.find_modules_that_directly_import("fedsim.executor.ray_warm") == set()


ARCHITECTURE = PACKAGE_DIR.parent / "docs" / "architecture.md"
THIN = {"run", "types", "params", "seeding", "__main__", "__init__"}  # modules directly under fedsim/, not packages


@functools.cache
def _package_imports() -> dict[str, set[str]]:
    """Each package of fedsim: the other packages its modules import (TYPE_CHECKING and function-level imports
    count, as for import-linter)."""
    graph = grimp.build_graph("fedsim")
    found: dict[str, set[str]] = {}
    for module in graph.modules:
        parts = module.split(".")
        if len(parts) < 2 or parts[1] in THIN or not (PACKAGE_DIR / parts[1]).is_dir():
            continue
        targets = {t.split(".")[1] for t in graph.find_modules_directly_imported_by(module) if t.count(".") >= 1}
        found.setdefault(parts[1], set()).update(targets - {parts[1]} - THIN)
    return found


def _layer_table() -> dict[str, tuple[int, set[str]]]:
    """architecture.md's dependency table: package -> (layer, what it imports today)."""
    text = ARCHITECTURE.read_text()
    section = text[text.index("## Dependency direction") :]
    section = section[: section.index("\n## ", 3)]
    rows = re.findall(r"^\| `(\w+)` \| (\d+) \| ([^|]+) \|", section, flags=re.MULTILINE)
    return {name: (int(layer), set(re.findall(r"`(\w+)`", imports))) for name, layer, imports in rows}


def test_architecture_md_says_what_each_package_imports_today() -> None:
    table, actual = _layer_table(), _package_imports()
    assert set(table) == set(actual), "one row per package of fedsim"
    wrong = {pkg: (sorted(table[pkg][1]), sorted(actual[pkg])) for pkg in actual if table[pkg][1] != actual[pkg]}
    assert not wrong, f"docs/architecture.md's 'Imports today' (written, actual): {wrong}"


def test_architecture_md_copies_the_layer_contract() -> None:
    toml = (PACKAGE_DIR.parent / "pyproject.toml").read_text()  # (tomllib is 3.11+; fedsim supports 3.10)
    layers = re.findall(r'"([^"]+)"', re.search(r"^layers = \[(.*?)^\]", toml, re.MULTILINE | re.DOTALL).group(1))
    expected = {m.strip().removeprefix("fedsim."): i + 1 for i, layer in enumerate(layers) for m in layer.split("|")}
    assert {pkg: layer for pkg, (layer, _) in _layer_table().items()} == expected


def _importers_of(*prefixes: str) -> set[str]:
    """The fedsim modules that import a module of one of the external packages ``prefixes`` (directly)."""
    graph = grimp.build_graph("fedsim", include_external_packages=True)
    return {
        m
        for m in graph.modules
        if m.startswith("fedsim")
        and any(t.split(".")[0] in prefixes for t in graph.find_modules_directly_imported_by(m))
    }


def test_hydra_and_omegaconf_are_imported_only_by_the_cli_the_trackers_builder_and_the_run_label() -> None:
    outside = {m for m in _importers_of("hydra", "omegaconf") if not m.startswith("fedsim.cli")}
    assert outside == {"fedsim.observe.trackers", "fedsim.observe.run_names"}, outside


def test_the_report_imports_neither_torch_nor_hydra() -> None:
    assert not {m for m in _importers_of("torch", "hydra", "omegaconf") if m.startswith("fedsim.report")}


def test_the_server_takes_at_most_ten_parameters() -> None:
    from fedsim.server import Server

    parameters = [p for p in inspect.signature(Server.__init__).parameters if p != "self"]
    assert len(parameters) <= 10, parameters


@pytest.mark.parametrize(
    ("module", "names"),
    [
        ("fedsim.run", ["compose", "run_config", "build_server", "ConfigError", "main"]),
        ("fedsim.types", ["ClientUpdate", "ClientFailure", "FitTask", "EvalTask"]),
        ("fedsim.params", ["flatten", "load_flat", "ParamLayout"]),
        ("fedsim.seeding", ["partition_seed", "task_seed", "sampling_rng"]),
        ("fedsim.client", ["Client", "evaluate_indices", "example_losses"]),
        ("fedsim.server", ["Server", "RunResult", "RoundFailedError", "Federation", "Schedule", "Stages"]),
        ("fedsim.strategy", ["Strategy", "LocalTraining", "gradients", "FedAvg"]),
        ("fedsim.cli", ["main"]),
        ("fedsim.executor", ["ProcessExecutor", "RayExecutor", "SerialExecutor", "VmapExecutor", "Workload"]),
        ("fedsim.executor.process", ["ProcessExecutor"]),
        ("fedsim.executor.ray", ["RayExecutor", "release_warm_actors"]),
        ("fedsim.executor.ray_warm", ["release_warm_actors"]),
        ("fedsim.executor.vmap", ["VmapExecutor", "VmapUnsupportedError"]),
    ],
)
def test_the_import_paths_researchers_use_still_resolve(module: str, names: list[str]) -> None:
    """The paths the docs, the notebook and researchers' scripts import from (thin re-exports where a module moved)
    give the same objects as the modules that define them."""
    imported = importlib.import_module(module)
    for name in names:
        value = getattr(imported, name)
        home = importlib.import_module(value.__module__)
        assert getattr(home, value.__name__) is value, (module, name)


def test_the_old_keyword_arguments_of_server_are_one_line_naming_their_group() -> None:
    from fedsim.server import Server

    with pytest.raises(TypeError) as info:
        Server(model_factory=None, clients=[], num_rounds=3, checkpoint_dir="x", compression=None)
    message = str(info.value)
    assert "\n" not in message and "clients -> federation=Federation(...)" in message
    assert (
        "num_rounds -> schedule=Schedule(...)" in message
        and "checkpoint_dir -> checkpoints=Checkpoints(dir=...)" in message
    )
    assert "compression -> stages=Stages(...)" in message


def test_every_fedsim_file_the_docs_and_configs_name_exists() -> None:
    """A path such as ``fedsim/cli/config.py`` in a guide, the README or a config comment names a real file."""
    root = PACKAGE_DIR.parent
    sources = [
        root / "README.md",
        root / "CONTRIBUTING.md",
        *(root / "docs").glob("*.md"),
        *(root / "conf").rglob("*.yaml"),
    ]
    named = {(src.name, m) for src in sources for m in re.findall(r"\bfedsim/[\w/]+\.py\b", src.read_text())}
    assert len(named) > 50  # the docs were read
    missing = sorted((src, path) for src, path in named if not (root / path).exists())
    assert not missing, missing


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package of fedsim (read from the files, nothing imported)."""
    path = PACKAGE_DIR.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a ``from ... import`` reads from, relative imports resolved against ``module``."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")[: len(module.split(".")) + is_package - node.level]
    return ".".join(parts + ([node.module] if node.module else []))


def _private_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """The private names (``_x``) that the fedsim module ``module`` (text: ``source``) takes from another fedsim
    module: ``from fedsim.a import _x``, ``import fedsim._a``, and ``m._x`` for a module ``m`` it imported
    (``import fedsim.a as m``, ``from fedsim import a``) or named in full (``fedsim.a._x``)."""
    tree = ast.parse(source)
    found: list[str] = []
    modules: dict[str, str] = {}  # a local name bound to a fedsim module -> that module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, is_package)
            if base.split(".")[0] != "fedsim":
                continue
            for alias in node.names:
                if base != module and (_is_private(alias.name) or any(map(_is_private, base.split(".")))):
                    found.append(f"line {node.lineno}: from {base} import {alias.name}")
                if _is_module(f"{base}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in (a for a in node.names if a.name.split(".")[0] == "fedsim"):
                if any(map(_is_private, alias.name.split("."))):
                    found.append(f"line {node.lineno}: import {alias.name}")
                if alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            owner = ast.unparse(node.value)
            target = modules.get(owner, owner if _is_module(owner) else None)
            if target is not None and target != module:
                found.append(f"line {node.lineno}: {owner}.{node.attr} ({target})")
    return sorted(found, key=lambda line: int(line.split(":")[0].split()[1]))


def test_the_private_import_finder_finds_each_kind_and_only_those() -> None:
    source = (
        "from fedsim.data.vision import _open, cifar10\n"
        "from fedsim.data import leaf\n"
        "import fedsim.data.text as text_module\n"
        "from fedsim.core.checks import integer as _integer\n"
        "from . import _sibling\n"
        "leaf._layout(1)\nleaf.read_layout(1)\ntext_module._WORD\nfedsim.core._x\nself._own\n"
    )
    assert _private_imports(source, "fedsim.data.text_corpus") == [
        "line 1: from fedsim.data.vision import _open",
        "line 5: from fedsim.data import _sibling",
        "line 6: leaf._layout (fedsim.data.leaf)",
        "line 8: text_module._WORD (fedsim.data.text)",
        "line 9: fedsim.core._x (fedsim.core)",
    ]
    assert _private_imports("from .text import _WORD\n", "fedsim.data", is_package=True) == [
        "line 1: from fedsim.data.text import _WORD"
    ]
    assert _private_imports("import fedsim.data.text as t\nt._WORD\n", "fedsim.data.text") == []


def test_no_module_of_fedsim_takes_a_private_name_from_another() -> None:
    """A name that another module needs is public and documented where it is defined; ``_x`` is private to its
    module (issue #42: the dataset readers had ten such imports)."""
    found = []
    files = sorted(PACKAGE_DIR.rglob("*.py"))
    for path in files:
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        found += [f"{module}: {line}" for line in _private_imports(path.read_text("utf-8"), module, is_package)]
    assert len(files) > 150  # every module was read
    assert found == []
