"""The shape of the package that docs/architecture.md draws: no import circles between fedsim's modules (imports
under ``TYPE_CHECKING`` and inside functions included, as grimp reads them), and at most 10 modules directly under
``fedsim/``. The layers and independence contracts themselves are checked by ``lint-imports`` (pyproject.toml)."""

from __future__ import annotations

import importlib
import inspect
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
