"""Suite-wide settings. Its folder (``tests/``) is on ``sys.path`` for every test, so the shared helpers
(``cli_runner``, ``own_processes``, ``vision_files``, ...) import by name from any subfolder.

* The test folders mirror fedsim's packages (``tests/core/`` tests ``fedsim/core/``, ...). pytest imports every test
  file, and Python every helper, by its bare name (pytest's default ``prepend`` import mode: no ``__init__.py``, each
  file's folder goes on ``sys.path``), so two ``.py`` files of the same name in two folders would clash (or one
  helper would silently shadow the other): :func:`pytest_configure` refuses that in one line, before collecting.

* ``RAY_ADDRESS=local``: a test's ``ray.init()`` without an address starts a Ray of its own, never joins a cluster
  that another program on the machine started with ``ray start`` (Ray's default is to join the newest one named in
  /tmp/ray/ray_current_cluster). Subprocesses inherit it.
* ``local_ray``: one local Ray for the Ray tests that can share it.
* Under ``pytest -n N --dist loadfile`` (``.ci/run``), a file's tests run in one worker, and the files in
  :data:`RAY_FILES` all in the same one, so that one suite runs one Ray at a time: each Ray brings daemons and
  pre-started workers, and with four at once on two cores (``-n 4``) a Ray test that takes 10 s took 100 s. With
  two workers the whole suite took about as long either way (6:22 apart, 6:35 together); together keeps the
  Ray tests' timeouts far from the limit when a second copy of the suite runs on the same machine.
* The ``slow`` marker (pyproject.toml) keeps ``pytest -m "not slow"`` a quick inner loop. A test that is not marked
  and took longer than :data:`UNMARKED_LIMIT_S` (set-up, call and tear-down together) is named at the end of the
  run, so that the tiers stay honest as tests change.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ["RAY_ADDRESS"] = "local"
# tests/executor/ray/ (the tests of fedsim.executor.ray) is a folder named like the Ray library. Where Ray is not
# installed, `import ray` with tests/executor on sys.path (the executor tests put it there) would import that folder
# as an empty namespace package instead of failing; marked missing here, `import ray` raises ImportError and
# `pytest.importorskip("ray")` skips, as without the folder.
if importlib.util.find_spec("ray") is None:
    sys.modules["ray"] = None  # type: ignore[assignment]

UNMARKED_LIMIT_S = 5.0
# the test files that start Ray (through ``local_ray``, a cluster or a script of their own); a test that asks for
# ``local_ray`` from another file stops the collection, so the list stays complete
RAY_FILES = frozenset(
    {
        "tests/executor/ray/test_ray.py",
        "tests/executor/ray/test_ray_faults.py",
        "tests/executor/ray/test_ray_reuse.py",
        "tests/executor/ray/test_ray_cluster.py",
        "tests/executor/test_per_batch_executors.py",
        "tests/executor/test_local_steps_executors.py",
        "tests/executor/test_malformed_updates.py",
        "tests/client/test_client_state_runs.py",
        "tests/llm/test_lora_ray.py",
        "tests/llm/test_lora_executors.py",
        "tests/server/test_round_steps.py",
        "tests/secagg/test_secagg_executors.py",
    }
)
# the files that took longest outside the Ray unit (per-file totals of a whole run, 2026-12-06), longest first: handed
# out first, so that the run does not end waiting on one of them
# the Ray files that shut the suite's local Ray down (a cluster of their own): run last, after every test that shares it
RAY_LAST = frozenset({"tests/executor/ray/test_ray_cluster.py"})
LONGEST_FILES = (
    "tests/core/test_checkpoint.py",
    "tests/core/test_run_dir_lock.py",
    "tests/cli/test_config.py",
    "tests/executor/process/test_process.py",
    "tests/client/test_client_state_resume.py",
    "tests/executor/process/test_worker_kill_loop.py",
    "tests/test_one_line_refusals.py",
    "tests/cli/test_multirun_leaks.py",
    "tests/llm/test_lora_resume.py",
    "tests/privacy/test_private_runs.py",
    "tests/observe/test_trackers.py",
    "tests/cli/test_sweepers.py",
    "tests/cli/test_sweep.py",
    "tests/strategy/test_configs.py",
)
_unmarked_durations: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "slow" not in report.keywords:
        _unmarked_durations[report.nodeid] = _unmarked_durations.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    over = sorted(((s, n) for n, s in _unmarked_durations.items() if s > UNMARKED_LIMIT_S), reverse=True)
    if over:
        terminalreporter.section("tests over the inner loop's limit")
        terminalreporter.write_line(
            f"not marked slow and over {UNMARKED_LIMIT_S:g} s (mark them @pytest.mark.slow, "
            f"or make them cheaper; CONTRIBUTING.md):"
        )
        for seconds, nodeid in over:
            terminalreporter.write_line(f"  {seconds:6.1f} s  {nodeid}")


@pytest.fixture(scope="session")
def _ray_shut_down_at_the_end() -> Iterator[None]:
    yield
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()


@pytest.fixture()
def local_ray(_ray_shut_down_at_the_end: None) -> Any:
    """One local Ray (2 CPUs) for every test that asks for it, started by the first (it takes seconds) and shut down
    at the end of the session; executors join it (``address=None`` reuses an initialised Ray), so none of them owns
    it. A test that needs Ray not running (a cluster of its own) shuts it down; the next one starts it again."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    return ray


def pytest_configure(config: pytest.Config) -> None:
    """Refuse, in one line, two modules of one name under tests/ (see the module's docstring), and a name in
    :data:`RAY_FILES`, :data:`RAY_LAST` or :data:`LONGEST_FILES` that is no file (a test file moved or renamed)."""
    tests = Path(__file__).resolve().parent
    seen: dict[str, list[str]] = {}
    for path in sorted(tests.rglob("*.py")):
        relative = path.relative_to(tests.parent).as_posix()
        if path.name != "conftest.py" and "fixtures" not in path.relative_to(tests).parts[:1]:
            seen.setdefault(path.name, []).append(relative)
    clashes = [" and ".join(paths) for paths in seen.values() if len(paths) > 1]
    if clashes:
        raise pytest.UsageError(f"{'; '.join(clashes)} share a name: rename one (tests import modules by name)")
    stale = sorted(name for name in RAY_FILES | RAY_LAST | set(LONGEST_FILES) if not (tests.parent / name).is_file())
    if stale:
        raise pytest.UsageError(f"{', '.join(stale)} in tests/conftest.py's RAY_FILES or LONGEST_FILES is no file")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a file that asks for ``local_ray`` and is not in :data:`RAY_FILES`; move the tests of
    :data:`RAY_LAST` to the end (they shut the shared local Ray down: after them, the next test that needs it would
    start it, and its actors, again)."""
    strays = sorted(
        {item.nodeid.split("::")[0] for item in items if "local_ray" in getattr(item, "fixturenames", ())} - RAY_FILES
    )
    if strays:
        raise pytest.UsageError(f"{', '.join(strays)} start Ray: add them to RAY_FILES in tests/conftest.py")
    items.sort(key=lambda item: item.nodeid.split("::")[0] in RAY_LAST)  # stable: the order is kept otherwise


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with the files of :data:`RAY_FILES` as one unit of work (one worker, one Ray at a time),
    handed out first, then the :data:`LONGEST_FILES`. It overrides two methods of pytest-xdist's
    ``LoadFileScheduling`` (3.x)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class RayFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "ray" if scope in RAY_FILES else scope

        def _assign_work_unit(self, node: Any) -> None:
            # the longest units first, so that the run does not end waiting on one long file; the many short files
            # fill the gaps
            for scope in reversed(("ray", *LONGEST_FILES)):
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return RayFilesTogether(config, log)
