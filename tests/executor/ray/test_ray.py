"""RayExecutor: same answers as the serial reference, faults handled, Ray left as it was found.

One local Ray instance serves the whole suite (it takes seconds to start; tests/conftest.py's ``local_ray``);
every executor joins it, so none of them owns it.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from ray import cloudpickle  # noqa: E402

from fedsim.client.base import Client  # noqa: E402
from fedsim.client.federation import make_clients  # noqa: E402
from fedsim.core.types import ClientFailure, ClientUpdate, FitTask  # noqa: E402
from fedsim.executor import RayExecutor, SerialExecutor  # noqa: E402
from fedsim.executor.base import Workload  # noqa: E402
from fedsim.executor.ray.executor import MISSING_RAY  # noqa: E402
from fedsim.models import MLP2NN  # noqa: E402
from fedsim.server.server import RoundFailedError  # noqa: E402
from fedsim.server.settings import Evaluation  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/executor: fault_clients, executor_runs
import fault_clients  # noqa: E402
from builders import tiny_server  # noqa: E402
from executor_runs import (  # noqa: E402
    PER_ROUND,
    ROUNDS,
    federation_data,
    first_sampled_client,
    run,
    serial_reference,
    worker_pids,
)

cloudpickle.register_pickle_by_value(fault_clients)  # Ray workers do not share this test's sys.path
pytestmark = pytest.mark.slow  # every test here starts Ray actors (a few seconds each)
# two actors, kept for the next test's run (RayExecutor(reuse_actors=True)) unless the subject is an actor's start
ON_RAY = ["executor=ray", "executor.workers=2", "executor.reuse_actors=true"]


@pytest.fixture(autouse=True)
def _on_local_ray(local_ray) -> None:  # type: ignore[no-untyped-def]
    """Every test here runs on the suite's local Ray (tests/conftest.py)."""


@pytest.mark.parametrize("workers", [1, 2])
def test_bitwise_equal_to_serial(workers: int) -> None:
    """(That an executor that joined Ray without keeping its actors leaves it up: test_ray_reuse.py's
    test_a_run_without_reuse_kills_the_kept_actors_first.)"""
    reference = serial_reference()
    result = run(RayExecutor(workers=workers, reuse_actors=True))  # the actors serve the tests below
    assert torch.equal(result.params, reference)
    used = {c["worker"] for r in result.history for c in r["clients"]}
    assert used <= {f"r{i}" for i in range(workers)}
    if workers > 1:
        assert len(used) > 1, "tasks should spread over actors"


def test_char_lstm_bitwise_equal_to_serial() -> None:
    """The McMahan et al. character LSTM on Shakespeare-like token rows (test_text_executors.py's federation)."""
    import test_text_executors as text

    result = text.run(RayExecutor(workers=2, reuse_actors=True))
    assert torch.equal(result.params, text.serial_reference("char_lstm").params)


def test_simulated_clock_gives_serial_metrics_and_times() -> None:
    """A run with availability, over-selection and a deadline that drops and cuts clients (tests/sim/test_clock.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sim"))
    import test_clock as clocked

    from fedsim.cli.run import build_server, compose

    reference = build_server(compose(clocked.CLOCKED)).run()
    result = build_server(compose([*clocked.CLOCKED, *ON_RAY])).run()
    assert clocked._sim(result.history) == clocked._sim(reference.history)
    assert torch.equal(result.params, reference.params)


@pytest.mark.parametrize(
    ("module", "settings"),
    [
        ("test_fedbuff", "BUFFERED"),
        ("test_fedbuff", "COMPRESSED"),
        ("test_fedbuff_attacks", "ATTACKED"),
        ("test_fedbuff_availability", "AVAILABLE"),
        ("test_basgd", "ROBUST"),
    ],
)
def test_fedbuff_gives_serial_metrics_and_times(module: str, settings: str) -> None:
    """The asynchronous loop's batches (one per start version) run on Ray actors: same events, same weights; also
    with top-k and error feedback up and QSGD down, attacked by ALIE, with clients going offline, and with
    BASGD's buffers and median (tests/sim/test_fedbuff*.py, test_basgd.py)."""
    import importlib

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sim"))
    buffered = importlib.import_module(module)
    from fedsim.cli.run import build_server, compose

    overrides = getattr(buffered, settings)
    reference = build_server(compose(overrides)).run()
    result = build_server(compose([*overrides, *ON_RAY])).run()
    assert buffered._sim(result.history) == buffered._sim(reference.history)
    assert torch.equal(result.params, reference.params)


def test_compression_gives_serial_weights_and_metrics() -> None:
    """Top-k then QSGD with error feedback up, float16 down (tests/comm/test_compressed_runs.py): the same weights,
    bytes and residuals on Ray actors."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "comm"))
    import test_compressed_runs as compressed

    from fedsim.cli.run import build_server, compose

    reference = build_server(compose(compressed.STACKED)).run()
    result = build_server(compose([*compressed.STACKED, *ON_RAY])).run()
    assert compressed._measured_free(result.history) == compressed._measured_free(reference.history)
    assert torch.equal(result.params, reference.params)


def test_central_dp_gives_serial_weights_metrics_and_epsilon() -> None:
    """DP-FedAvg with adaptive clipping (tests/privacy/test_private_runs.py): same noise, clip norms and ε on Ray."""
    pytest.importorskip("dp_accounting")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "privacy"))
    import test_private_runs as private

    from fedsim.cli.run import build_server, compose

    reference = build_server(compose(private.ADAPTIVE)).run()
    result = build_server(compose([*private.ADAPTIVE, *ON_RAY])).run()
    assert private._measured_free(result.history) == private._measured_free(reference.history)
    assert torch.equal(result.params, reference.params)


def test_local_dp_sgd_gives_serial_weights() -> None:
    """client=dpsgd (tests/privacy/test_local_dp.py): Poisson batches and noise from the task generator on Ray."""
    pytest.importorskip("dp_accounting")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "privacy"))
    import test_local_dp as local

    from fedsim.cli.run import build_server, compose

    reference = build_server(compose(local.SHORT)).run()
    result = build_server(compose([*local.SHORT, *ON_RAY])).run()
    assert torch.equal(result.params, reference.params)


@pytest.mark.parametrize("attack", ["alie", "backdoor"])
def test_attacks_give_serial_weights(attack: str) -> None:
    """ALIE against Multi-Krum and a backdoor (tests/attacks/): the same crafted updates and poisoned data on Ray."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "attacks"))
    import test_attacked_runs as attacked
    import test_data_poisoning as poisoned

    from fedsim.cli.run import build_server, compose

    settings = attacked.ALIE if attack == "alie" else poisoned.BACKDOOR
    reference = build_server(compose(settings)).run()
    result = build_server(compose([*settings, *ON_RAY])).run()
    assert attacked._measured_free(result.history) == attacked._measured_free(reference.history)
    assert torch.equal(result.params, reference.params)


@pytest.mark.parametrize("rule", ["fltrust", "bulyan", "zeno"])
def test_new_robust_rules_give_serial_weights(rule: str) -> None:
    """FLTrust and Zeno (their server-side work on the root dataset runs in the driver) and Bulyan, attacked: the Ray
    run's weights are the serial run's (tests/strategy/test_fltrust.py, test_bulyan.py, test_zeno.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "strategy"))
    import test_bulyan
    import test_fltrust
    import test_zeno

    from fedsim.cli.run import build_server, compose

    settings = {"fltrust": test_fltrust.ATTACKED, "bulyan": test_bulyan.ATTACKED, "zeno": test_zeno.ATTACKED}[rule]
    reference = build_server(compose(settings)).run()
    result = build_server(compose([*settings, *ON_RAY])).run()
    assert torch.equal(result.params, reference.params)
    assert [r["attack/malicious_selected"] for r in result.history] == [
        r["attack/malicious_selected"] for r in reference.history
    ]


def test_raising_client_is_reported_with_traceback_and_policy_applies() -> None:
    with pytest.raises(RoundFailedError, match=r"client \d+ fails on purpose"):
        run(RayExecutor(workers=2, reuse_actors=True), fault_clients.RaisingClient, bad_ids=tuple(range(8)))
    result = run(
        RayExecutor(workers=2, reuse_actors=True),
        fault_clients.RaisingClient,
        min_success_fraction=0.5,
        bad_ids=(1, 3, 5),
    )
    assert sum(len(r["clients"]) for r in result.history) < ROUNDS * PER_ROUND, "a bad client was sampled"
    assert all(c["client_id"] not in (1, 3, 5) for r in result.history for c in r["clients"])


def test_failure_carries_the_traceback() -> None:
    data = federation_data()
    clients = make_clients(data, functools.partial(fault_clients.RaisingClient, bad_ids=(1,), epochs=1, batch_size=8))
    factory = functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=32)
    params = torch.cat([p.detach().flatten() for p in factory().parameters()])
    with RayExecutor(workers=2, reuse_actors=True) as executor:
        executor.start(Workload(factory, clients, data.train))
        results = executor.fit(params, [FitTask(1, 1, 11), FitTask(0, 1, 10)])
    assert [r.client_id for r in results] == [0, 1]
    failure = results[1]  # the second idle actor gets the second task in client order
    assert isinstance(failure, ClientFailure) and failure.worker == "r1"
    assert "Traceback" in failure.traceback and "fails on purpose" in failure.traceback


def test_sigkilled_actor_is_replaced_and_result_unchanged(tmp_path: Path) -> None:
    marker = tmp_path / "killed"
    result = run(
        RayExecutor(workers=2, reuse_actors=True),
        fault_clients.KillOnceClient,
        victim=first_sampled_client(),
        marker=str(marker),
    )
    assert marker.exists(), "the victim never ran"
    assert not Path(f"/proc/{int(marker.read_text())}").exists()
    assert torch.equal(result.params, serial_reference())


def test_client_that_hangs_once_is_timed_out_retried_and_result_unchanged(tmp_path: Path) -> None:
    marker = tmp_path / "hung"
    executor = RayExecutor(workers=2, client_timeout_s=1.5, reuse_actors=True)
    result = run(executor, fault_clients.HangClient, victim=first_sampled_client(), marker=str(marker))
    assert marker.exists(), "the victim never ran"
    assert torch.equal(result.params, serial_reference())


def test_actor_logs_are_tagged_and_prints_stay_out_of_ray_output(tmp_path: Path) -> None:
    run(RayExecutor(workers=2, reuse_actors=True), fault_clients.PrintingClient, run_dir=tmp_path)
    files = sorted((tmp_path / "workers").glob("ray-worker-*.log"))
    assert [f.name for f in files] == ["ray-worker-0.log", "ray-worker-1.log"]
    logs = "".join(f.read_text() for f in files)
    assert re.search(r"\[round 1 client \d+\] hello from client \d+", logs)
    assert re.search(r"\[r\d\] \[round \d+ client \d+\] INFO trained: \d+ examples", logs)
    assert len(worker_pids(tmp_path)) == 2, "each actor logs its own ready line with its pid"
    # What an actor prints to its own stdout/stderr lands in Ray's worker-*.out/.err files, which
    # log_to_driver streams to the driver's console: none of the clients' prints may be there.
    ray_logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    streamed = "".join(
        p.read_text(errors="replace") for p in ray_logs.glob("worker-*.*") if p.suffix in (".out", ".err")
    )
    assert "hello from client" not in streamed


# --- issue #16's algorithms and every-client evaluation: Ray actors give the serial executor's answers -----------


class _BatchNormMLP(torch.nn.Module):
    """A small MLP with BatchNorm (for FedBN) and a last layer of its own (for Ditto's and FedRep's heads)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(60, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the model class above reaches the actors by value


def _algorithm_run(strategy, executor):  # type: ignore[no-untyped-def]
    from fedsim.client.evaluation import ClientEvaluation
    from fedsim.observe.run_logger import RunLogger

    server = tiny_server(
        federation_data(),
        model=_BatchNormMLP,
        # one batch per epoch (every client has fewer than 64 training examples): BatchNorm never sees a batch of one
        client=functools.partial(Client, epochs=2, batch_size=64),
        strategy=strategy,
        executor=executor,
        num_rounds=3,
        clients_per_round=4,
        seed=7,
        logger=RunLogger(None, progress=False),
        evaluation=Evaluation(clients=ClientEvaluation("all")),
    )
    result = server.run()
    states = {cid: server.parts.client_states.get(cid) for cid in server.parts.client_states.clients()}
    evaluated = [{k: v for k, v in r.items() if k.startswith("eval")} for r in result.history]
    return result.params, states, evaluated


def _algorithms():  # type: ignore[no-untyped-def]
    from fedsim.strategy import QFFL, Ditto, FedBN, FedDyn, FedNova, FedRep

    return {
        "fednova": FedNova,
        "feddyn": functools.partial(FedDyn, alpha=0.1),
        "fedbn": FedBN,
        "ditto": Ditto,
        "fedrep": functools.partial(FedRep, head_epochs=1),
        "qffl": QFFL,
    }


@pytest.mark.parametrize("name", ["fednova", "feddyn", "fedbn", "ditto", "fedrep", "qffl"])
def test_new_algorithms_with_every_client_evaluation_equal_serial(name: str) -> None:
    make = _algorithms()[name]
    params, states, evaluated = _algorithm_run(make(), SerialExecutor())
    ray_params, ray_states, ray_evaluated = _algorithm_run(make(), RayExecutor(workers=2, reuse_actors=True))
    assert torch.equal(params, ray_params) and _same_states(states, ray_states) and evaluated == ray_evaluated
    assert evaluated[-1]["eval_global/clients"] == 8


def _same_states(a: object, b: object) -> bool:
    """Equal client states: the same keys, tensors equal bit for bit."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_states(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    return a == b


# --- one actor (workers=1): last in this file, so that the tests above (two actors each) share the two kept actors
# instead of starting new ones whenever the count changes ------------------------------------------------------------


def test_sigkilled_actor_without_retries_says_possibly_out_of_memory(tmp_path: Path) -> None:
    executor = RayExecutor(workers=1, max_retries=0, reuse_actors=True)
    with pytest.raises(RoundFailedError, match=r"Ray worker r0 was killed or crashed \(possibly out of memory"):
        run(executor, fault_clients.KillOnceClient, victim=first_sampled_client(), marker=str(tmp_path / "killed"))


def test_tasks_queued_behind_a_dying_client_are_not_charged_a_retry(tmp_path: Path) -> None:
    """One actor gets client 0 and, queued behind it, client 1; client 0 kills the actor. Client 1
    never started, so it is run again on the replacement without using up a retry."""
    data = federation_data()
    kill = functools.partial(
        fault_clients.KillOnceClient, victim=0, marker=str(tmp_path / "killed"), epochs=1, batch_size=8
    )
    factory = functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=32)
    params = torch.cat([p.detach().flatten() for p in factory().parameters()])
    tasks = [FitTask(0, 1, 10), FitTask(1, 1, 11)]
    with RayExecutor(workers=1, max_retries=0, reuse_actors=True) as executor:
        executor.start(Workload(factory, make_clients(data, kill), data.train))
        dead, trained = executor.fit(params, tasks)
    assert isinstance(dead, ClientFailure) and "killed or crashed" in dead.error and dead.attempts == 1
    with SerialExecutor() as serial:
        serial.start(
            Workload(factory, make_clients(data, functools.partial(Client, epochs=1, batch_size=8)), data.train)
        )
        reference = serial.fit(params, tasks)[1]
    assert isinstance(trained, ClientUpdate) and torch.equal(trained.params, reference.params)


def test_always_hanging_client_times_out_after_bounded_retries(tmp_path: Path) -> None:
    executor = RayExecutor(workers=1, client_timeout_s=1, max_retries=1, reuse_actors=True)
    with pytest.raises(RoundFailedError, match=r"1 of 4 clients failed .*timed out"):
        run(executor, fault_clients.HangClient, victim=first_sampled_client(), marker=str(tmp_path / "m"), always=True)


# --- a Ray of the test's own: subprocesses ----------------------------------------------------------------------------

OWN_RAY = """
import functools, logging, os, sys, time
from pathlib import Path
import ray, torch
from fedsim.client.base import Client
from fedsim.client.federation import federate, make_clients
from fedsim.data.partition import natural
from fedsim.data.synthetic import synthetic
from fedsim.executor import RayExecutor, SerialExecutor
from fedsim.executor.base import Workload
from fedsim.models import LogisticRegression
from fedsim.core.types import ClientUpdate, FitTask

GIB = 2**30

class HogOnceClient(Client):
    \"\"\"The first time it trains (tracked by a marker file) it takes memory, 256 MiB at a time, until killed.\"\"\"
    def __init__(self, *args, marker="", **kwargs):
        super().__init__(*args, **kwargs)
        self.marker = marker
    def fit(self, model, data, **kwargs):
        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            blocks = []
            for _ in range(32):  # at most 8 GiB, every page touched
                blocks.append(torch.ones(GIB // 16))
                time.sleep(0.05)
            time.sleep(10)
            raise RuntimeError(f"took {len(blocks) / 4:g} GiB and was not killed")
        return super().fit(model, data, **kwargs)

class Warnings(logging.Handler):
    messages = []
    def emit(self, record):
        self.messages.append(record.getMessage())

def used_bytes():
    info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in open("/proc/meminfo")}
    return info["MemTotal"], info["MemTotal"] - info["MemAvailable"]

def descendants(root):
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            pass
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found

if __name__ == "__main__":
    data = federate(
        synthetic(num_devices=2, min_size=20, max_size=40, seed=1), natural, client_test_fraction=0.2, seed=0
    )
    clients = make_clients(data, functools.partial(HogOnceClient, marker=sys.argv[1], epochs=1, batch_size=8))
    factory = functools.partial(LogisticRegression, (60,), 10)
    total, used = used_bytes()  # Ray and one actor add about 1 GiB; the hog must pass the rest
    os.environ["RAY_memory_usage_threshold"] = f"{(used + 4 * GIB) / total:.4f}"
    os.environ["RAY_memory_monitor_refresh_ms"] = "100"
    warnings = Warnings()
    logging.getLogger("fedsim").addHandler(warnings)
    assert not ray.is_initialized()
    executor = RayExecutor(workers=1, max_retries=1)  # address=None and no Ray yet: it starts (and owns) one
    executor.start(Workload(factory, clients, data.train))
    [result] = executor.fit(torch.zeros(610), [FitTask(0, 1, 5)])
    started = descendants(os.getpid())
    print("ray up while it ran:", ray.is_initialized() and bool(started))
    executor.close()
    executor.close()  # safe twice
    print("ray up after close:", ray.is_initialized())
    with SerialExecutor() as serial:
        serial.start(Workload(factory, clients, data.train))
        [reference] = serial.fit(torch.zeros(610), [FitTask(0, 1, 5)])
    same = isinstance(result, ClientUpdate) and torch.equal(result.params, reference.params)
    print("retried update equal to serial:", same, result)
    print("warnings:", warnings.messages)
    deadline = time.monotonic() + 20
    while (alive := {p for p in started if Path(f"/proc/{p}").exists()}) and time.monotonic() < deadline:
        time.sleep(0.2)
    print("left behind:", sorted(alive))
"""


@pytest.fixture(scope="module")
def own_ray(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """One script (Ray takes seconds to start), two subjects: a RayExecutor with no Ray to join starts a Ray of its
    own, with a memory threshold 4 GiB above what the machine uses now (headroom for other programs on the machine:
    the threshold is the whole machine's); its client takes memory until Ray's memory monitor kills the actor; its
    close shuts that Ray down and leaves no process behind."""
    folder = tmp_path_factory.mktemp("own_ray")
    script = folder / "own_ray.py"
    script.write_text(OWN_RAY)
    done = subprocess.run(
        [sys.executable, str(script), str(folder / "hogged")], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_actor_killed_by_rays_memory_monitor_is_reported_as_out_of_memory_and_retried(
    own_ray: subprocess.CompletedProcess[str],
) -> None:
    assert "retried update equal to serial: True" in own_ray.stdout, own_ray.stdout
    assert "Ray worker r0 was killed by Ray's memory monitor: out of memory; replacing" in own_ray.stdout, (
        own_ray.stdout
    )


def test_executor_that_starts_ray_shuts_it_down_and_leaves_nothing(own_ray: subprocess.CompletedProcess[str]) -> None:
    assert "ray up while it ran: True" in own_ray.stdout and "ray up after close: False" in own_ray.stdout, (
        own_ray.stdout
    )
    assert "left behind: []" in own_ray.stdout, own_ray.stdout


MISSING = """
import sys
sys.modules["ray"] = None  # as if Ray were not installed
from fedsim.executor import RayExecutor
try:
    RayExecutor()
except ImportError as error:
    print(str(error))
    sys.exit(3)
"""


def test_missing_ray_gives_one_clear_line() -> None:
    done = subprocess.run([sys.executable, "-c", MISSING], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert (
        done.stdout.strip()
        == MISSING_RAY
        == "executor=ray needs the ray package: pip install 'fedsim-torch[ray]' (in a source checkout: "
        "pip install -e '.[ray]'; or pip install ray)"
    )
