"""AutoExecutor (``executor=auto``): serial for the first round, then serial or process, whichever costs less.

Serial and process give bitwise-identical results (same ``threads``), so choosing between them is a matter of cost
alone, and the cost depends on the model, the cohort and the machine's load. This executor trains the first round
serially, timing the clients, measures the cores other processes used meanwhile
(:mod:`fedsim.executor.cpu_load`), and at the second round's first task decides for the rest of the run with the
model of :mod:`fedsim.executor.auto_costs`; the choice and why go to the log in one line. vmap, whose results
are within float rounding of serial's but not bitwise equal, is considered only with ``allow_vmap=True``: it then
trains the second round as a trial and the decision comes at the third.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedsim.core.checks import integer, number
from fedsim.core.types import ClientFailure, EvalResult, EvalTask, FitTask, TaskResult
from fedsim.executor.auto_costs import Cores, Decision, FirstRound, decide, startup_estimate
from fedsim.executor.base import Executor, Workload, warm_up
from fedsim.executor.cpu_load import CpuWindow, usable_cores
from fedsim.executor.placement import physical_cores, plan_workers
from fedsim.executor.process import forkserver
from fedsim.executor.serial import SerialExecutor

log = logging.getLogger("fedsim")
UNKNOWN_ROUNDS_LEFT = 10  # rounds the start-up is spread over when ``rounds`` is not given


@dataclass
class _Trial:
    """One executor's trial round: its number, the clients' seconds and tasks so far, when it began, how long it
    lasted (set at the next round's first task)."""

    round_num: int
    clients_s: float = 0.0
    tasks: int = 0
    began: float = field(default_factory=time.perf_counter)
    round_s: float = 0.0


class AutoExecutor(Executor):
    """Serial for the first round, then serial or ``ProcessExecutor(devices="cpu", workers, threads)`` for the rest.

    ``rounds``: the run's number of rounds (``executor=auto`` passes ``num_rounds``; ``None``: the start-up of the
    workers is weighed against 10 rounds). ``allow_vmap``: also try ``VmapExecutor(threads)`` for one round and
    keep it if it is fastest (its results are not bitwise serial's). ``min_gain`` and ``margin_s``: process (or
    vmap) must save more than that share of the rest of the run and that many seconds. ``free_cores``,
    ``client_cost_s`` (the first round's clients, in seconds) and ``startup_s`` replace what would be measured or
    estimated: for tests, and for a machine whose load this process cannot see (another container's).

    A resumed run goes on as the checkpoint recorded (:meth:`state_dict`): with the executor chosen, or, before the
    choice, with the trial rounds' measurements, so that every round trains under the executor it would have
    without the interruption (this matters with ``allow_vmap``, whose results differ from serial's; serial and
    process agree bitwise, and the choice only changes the cost). A checkpoint without it (another executor's)
    has the resumed run try and decide as a new one would."""

    def __init__(
        self,
        *,
        rounds: int | None = None,
        workers: int | None = None,
        threads: int = 1,
        allow_vmap: bool = False,
        min_gain: float = 0.1,
        margin_s: float = 1.0,
        free_cores: float | None = None,
        client_cost_s: float | None = None,
        startup_s: float | None = None,
    ) -> None:
        if rounds is not None:
            integer("executor.rounds", rounds, 1)
        for key, value in (("free_cores", free_cores), ("client_cost_s", client_cost_s), ("startup_s", startup_s)):
            if value is not None:
                number(f"executor.{key}", value, at_least=0.0)
        number("executor.min_gain", min_gain, at_least=0.0)
        number("executor.margin_s", margin_s, at_least=0.0)
        self.workers = len(plan_workers(["cpu"], workers, None, threads, physical_cores()))
        self.rounds, self.threads, self.allow_vmap = rounds, threads, allow_vmap
        self.thresholds = (min_gain, margin_s)
        self.injected = {"free_cores": free_cores, "client_cost_s": client_cost_s, "startup_s": startup_s}
        self._window = CpuWindow()  # from now to the decision: the cores others use
        if self.workers > 1 and forkserver.has_core_to_spare():
            forkserver.worker_context()  # its imports run beside the first round, on the core serial leaves idle
        self._serial = SerialExecutor(threads=threads)
        self._active: Executor = self._serial
        self._active_name = "serial"
        self._workload: Workload | None = None
        self._trials: dict[str, _Trial] = {}  # serial's first round, then vmap's (allow_vmap)
        self._build_s = 0.0
        self.decision: Decision | None = None
        self._unavailable: dict[str, str] = {}  # executor -> why it cannot run this workload
        self._restored: dict[str, Any] | None = None  # a checkpoint's state, applied by start()

    def start(self, workload: Workload) -> None:
        self._workload = workload
        self._unavailable = candidates_refused(workload, self.workers, self.allow_vmap, self.threads)
        self._serial.start(workload)
        with torch.random.fork_rng(devices=[]):
            began = time.perf_counter()
            model = workload.model_factory()
            self._build_s = time.perf_counter() - began
            warm_up(model, workload.train_data)  # the optimizer's lazy imports, out of the first round's timing
        self._trials, self.decision, self._active, self._active_name = {}, None, self._serial, "serial"
        if self._restored is not None:
            self._resume(self._restored)

    def state_dict(self) -> dict[str, Any]:
        """For a checkpoint (plain values): the executor training now, the decision (``None`` before it) and the trial
        rounds' measurements (an open trial's round time taken as of now: the checkpoint comes at its round's end)."""
        now = time.perf_counter()
        trials = {
            name: [t.round_num, t.clients_s, t.tasks, t.round_s or now - t.began] for name, t in self._trials.items()
        }
        decision = None if self.decision is None else [self.decision.executor, self.decision.reason]
        return {"active": self._active_name, "decision": decision, "trials": trials}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on, from :meth:`start`, as the checkpoint's :meth:`state_dict` says."""
        self._restored = state

    def _resume(self, state: dict[str, Any]) -> None:
        self._trials = {
            name: _Trial(int(r), float(c), int(n), round_s=float(s)) for name, (r, c, n, s) in state["trials"].items()
        }
        if state["decision"] is not None:
            self.decision = Decision(*state["decision"])
            log.info("executor=auto: %s (the resumed run's checkpoint)", self.decision.reason)
        self._switch(str(state["active"]))

    def fit(self, global_params: torch.Tensor, tasks: Sequence[FitTask]) -> list[TaskResult]:
        if self._workload is None:
            raise RuntimeError("AutoExecutor.fit called before start()")
        if self.decision is None and tasks:
            self._next_trial(min(t.round_num for t in tasks))
        if self.decision is not None or not tasks:
            return self._active.fit(global_params, tasks)
        began = time.perf_counter()
        results = self._active.fit(global_params, tasks)
        trial = self._trials[self._active_name]
        trial.clients_s += time.perf_counter() - began
        trial.tasks += len(tasks)
        return results

    def evaluate(self, global_params: torch.Tensor, tasks: Sequence[EvalTask]) -> list[EvalResult | ClientFailure]:
        return self._active.evaluate(global_params, tasks)

    def close(self) -> None:
        """Close whichever executors were started; safe to call twice."""
        for executor in {id(e): e for e in (self._serial, self._active)}.values():
            executor.close()
        self._workload = None

    def _next_trial(self, round_num: int) -> None:
        """At a round's first task: open the serial trial, or, when the current trial's round is over, try vmap
        (``allow_vmap``, after serial) or decide."""
        if not self._trials:
            self._trials["serial"] = _Trial(round_num)
            return
        current = self._trials[self._active_name]
        if round_num == current.round_num:
            return
        if not current.round_s:  # the trial round's wall time, to this round's start (a resumed one's: recorded)
            current.round_s = time.perf_counter() - current.began
        if self._active_name == "serial" and self.allow_vmap and "vmap" not in self._unavailable:
            self._switch("vmap")
            self._trials["vmap"] = _Trial(round_num)
            return
        self._decide(round_num)

    def _decide(self, round_num: int) -> None:
        serial = self._trials["serial"]
        first = FirstRound(self._injected("client_cost_s", serial.clients_s), serial.round_s, serial.tasks)
        free = self.injected["free_cores"]
        usable = usable_cores()
        cores = Cores(usable, self._window.others_cores() if free is None else max(usable - free, 0.0))
        rounds_left = UNKNOWN_ROUNDS_LEFT if self.rounds is None else max(self.rounds - round_num + 1, 1)
        startup = self.injected["startup_s"]
        if startup is None:
            startup = startup_estimate(cores, self.workers, self._build_s, forkserver.started_s_ago())
        workers = 1 if "process" in self._unavailable else self.workers
        vmap_s = self._trials["vmap"].clients_s if "vmap" in self._trials else None
        self.decision = decide(first, cores, workers, rounds_left, startup, self.thresholds, vmap_s)
        refused = "".join(f"; {name} cannot run this workload: {why}" for name, why in self._unavailable.items())
        log.info("executor=auto: %s%s", self.decision.reason, refused)
        self._switch(self.decision.executor)

    def _injected(self, key: str, measured: float) -> float:
        value = self.injected[key]
        return measured if value is None else value

    def _switch(self, name: str) -> None:
        """Make ``name`` the executor of the rounds from now on (started here), closing the one it replaces."""
        assert self._workload is not None
        if name == self._active_name:
            return
        chosen = self._serial if name == "serial" else make_executor(name, self.workers, self.threads)
        chosen.start(self._workload)
        self._active.close()
        self._active, self._active_name = chosen, name


def make_executor(name: str, workers: int, threads: int) -> Executor:
    """The process or vmap executor ``executor=auto`` switches to."""
    if name == "process":
        from fedsim.executor.process import ProcessExecutor

        return ProcessExecutor(devices="cpu", workers=workers, threads=threads)
    from fedsim.executor.vmap import VmapExecutor

    return VmapExecutor(devices="cpu", threads=threads)


def candidates_refused(workload: Workload, workers: int, allow_vmap: bool, threads: int) -> dict[str, str]:
    """Why process (a piece of the workload cannot reach a worker) or vmap (what it cannot vectorise) cannot run
    ``workload``; neither is an error under ``auto``, which then does not consider that executor."""
    refused = {}
    if workers > 1:
        from fedsim.executor.process.pool import check_sendable

        try:
            check_sendable(workload)
        except TypeError as error:
            refused["process"] = str(error)
    if allow_vmap:
        try:
            make_executor("vmap", workers, threads).check(workload)
        except ValueError as error:
            refused["vmap"] = str(error)
    return refused
