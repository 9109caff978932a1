"""What ``executor=auto`` decides from: the first round's costs, the cores free, and a small model of both executors.

The model, stated so that its choices can be checked by hand:

* **Cores.** With ``others`` cores used by other processes on ``cores`` usable ones, ``n`` busy processes of ours get
  ``share(n) = min(n, cores - others)`` cores while they fit beside the others, and ``cores * n / (n + others)``
  once they do not (the scheduler shares the CPUs between runnable processes). Serial runs the clients in one
  process, ``share(1)``; the process executor in ``workers`` processes, ``share(workers)``.
* **A round.** Serial: the first round's ``round_s``, of which ``clients_s`` was the clients'. Process: the same
  round with the clients' part divided by ``share(workers) / share(1)`` plus :data:`TASK_OVERHEAD_S` per task
  (sending it and copying its update back; 0.3-0.5 ms measured by experiments/bench/task_gap.py on a quiet machine).
* **Start-up** (once): the forkserver's imports (:data:`PRELOAD_CPU_S` of CPU on one core, less the time since it was
  started) and every worker's model build (as long as the server's own build, measured) on ``share(workers)``.
  What this cannot see: modules a worker imports to build the model that the forkserver has not (a
  ``transformers`` model's ~3.5 CPU s, unless ``python -m fedsim`` preloaded them: preload_hf.py), so its start-up
  is underestimated for such models.

Process is chosen when it saves more than ``max(margin_s, min_gain * serial's time for the rounds left)``.
"""

from __future__ import annotations

from dataclasses import dataclass

PRELOAD_CPU_S = 6.0  # the forkserver's imports: torch, fedsim, an optimizer's lazy imports (5.5-6.5 s measured)
TASK_OVERHEAD_S = 0.001  # a task's cost in the process executor beyond the client's own training
WORKER_START_S = 0.05  # forking a worker and sending it the run's workload, beyond building its model


@dataclass(frozen=True)
class FirstRound:
    """What the first round cost under serial: the clients' time, the whole round's and its number of tasks."""

    clients_s: float
    round_s: float
    tasks: int


@dataclass(frozen=True)
class Cores:
    """The cores this process may use and the mean cores other processes used (``None``: not measurable)."""

    usable: float
    others: float | None

    def share(self, processes: int) -> float:
        """Cores ``processes`` busy processes of ours get beside the others' load (see the module docstring)."""
        others = self.others or 0.0
        if processes + others <= self.usable:
            return float(processes)
        return self.usable * processes / (processes + others)

    def describe(self) -> str:
        """E.g. ``1.9 of 2 cores free``."""
        if self.others is None:
            return f"cores free unknown (taken as all {self.usable:g})"
        return f"{max(self.usable - self.others, 0.0):.1f} of {self.usable:g} cores free"


@dataclass(frozen=True)
class Decision:
    """The executor chosen (``serial`` or ``process``) and the one line that says why."""

    executor: str
    reason: str


def startup_estimate(cores: Cores, workers: int, build_s: float, forkserver_age_s: float | None) -> float:
    """Seconds until ``workers`` process workers are ready: the forkserver's imports still to do (all of them when it
    was never started) and the workers' model builds, on the cores they would get."""
    preload = PRELOAD_CPU_S / max(cores.share(1), 0.05)
    remaining = preload if forkserver_age_s is None else max(preload - forkserver_age_s, 0.0)
    return remaining + workers * (build_s + WORKER_START_S) / max(cores.share(workers), 0.05)


def decide(
    first: FirstRound,
    cores: Cores,
    workers: int,
    rounds_left: int,
    startup_s: float,
    thresholds: tuple[float, float] = (0.1, 1.0),
    vmap_clients_s: float | None = None,
) -> Decision:
    """Serial, process (``workers`` workers) or, when a vmap round was tried (its clients took ``vmap_clients_s``),
    vmap, for the ``rounds_left`` rounds still to run. ``thresholds`` is ``(min_gain, margin_s)``: an executor other
    than serial must save more than both that share of serial's time and that many seconds over the best so far."""
    min_gain, margin_s = thresholds
    speedup = cores.share(workers) / max(cores.share(1), 1e-9)
    per_round = first.clients_s - (first.clients_s / speedup + first.tasks * TASK_OVERHEAD_S)
    serial_s = rounds_left * first.round_s
    needed = max(margin_s, min_gain * serial_s)
    predicted = {"serial": serial_s}
    if workers > 1:
        predicted["process"] = serial_s - rounds_left * per_round + startup_s
    if vmap_clients_s is not None:
        predicted["vmap"] = serial_s - rounds_left * (first.clients_s - vmap_clients_s)
    best = "serial"
    for name in ("process", "vmap"):
        if name in predicted and predicted[best] - predicted[name] > needed:
            best = name
    facts = (
        f"clients cost {first.clients_s:.2f} s of a {first.round_s:.2f} s round, {cores.describe()}, "
        f"{rounds_left} round{'s' if rounds_left != 1 else ''} left"
    )
    plural = "s" if workers != 1 else ""
    saving = rounds_left * per_round
    estimate = f"estimated: {workers} worker{plural} save ~{saving:.1f} s for ~{startup_s:.1f} s of start-up"
    if vmap_clients_s is not None:
        estimate += f"; vmap's clients took {vmap_clients_s:.2f} s a round"
    label = f"process ({workers} worker{plural})" if best == "process" else best
    return Decision(best, f"{label}: {facts}; {estimate}")
