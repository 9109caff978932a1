"""The event loop of asynchronous FL (FedBuff, :mod:`fedsim.strategy.fedbuff`) on the simulated clock.

Up to ``concurrency`` clients train at once. Each task starts from the global model version current at its start
time and finishes at ``start + its duration`` on the clock (:meth:`fedsim.sim.clock.SyncClock.timing`: download,
compute, upload). Events are handled in order of (finish time, start order), a deterministic tie-break. A finished
task's update goes to the buffer and a new client starts at once; a full buffer makes one server step, fedsim's
"round". Everything here is a pure function of the seed, the profiles and the results, so the run is the same under
every executor and worker count.

Parallelism: a task's result is needed only when its event comes, but its inputs (start weights, client, seed) are
known when it starts. When a result is needed, every started task without one is trained, one executor call per
start version (the K tasks started after a server step share it), so the executor gets batches to run in parallel.
With ``compression``, those clients receive the version's weights as encoded and their updates come back decoded
(:meth:`BufferedLoop._decoded`). With an attack, the malicious clients replace their updates once the buffer is full,
an omniscient attack seeing the buffer, and only then are the updates encoded (:meth:`BufferedLoop._attacked`).

New clients are drawn uniformly among the clients online and not training, from ``(seed, start order)``.
Availability (``clock.always_online=false``): a client whose online window closes before its task would finish
drops out at that moment, its update never arrives (it is not trained), and its slot goes to a new client; when no
idle client is online, slots stay empty until one comes online. A checkpoint (taken after a server
step, when the buffer is empty) holds the clock, the tasks in flight and the start weights they need; a resumed run
trains them again from the same inputs, so it continues exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from fedsim.core.seeding import task_seed
from fedsim.core.types import ClientUpdate, FitTask, TaskResult
from fedsim.server.exchange import task_state
from fedsim.server.strategy_guard import checked_client_values, checked_scalars
from fedsim.server.updates import apply_failure_policy, sound_updates
from fedsim.sim.clock import SyncClock, can_start, next_start_s, online_until
from fedsim.strategy.fedbuff import FedBuff

if TYPE_CHECKING:
    from fedsim.server.parts import RoundParts

_DOMAIN = 0xB0FF  # the stream that picks which client starts next


@dataclass(frozen=True)
class ServerStep:
    """One server step: the new weights, the updates it consumed (each with the weights its client started from),
    every update that arrived for it (all were sent and released, the rejected ones too), its metrics (the
    strategy's ``strategy/`` scalars among them) and the strategy's values per client
    (:meth:`~fedsim.strategy.Strategy.client_metrics`)."""

    params: torch.Tensor
    consumed: list[tuple[ClientUpdate, torch.Tensor]]
    arrived: list[ClientUpdate]
    metrics: dict[str, float]
    client_values: dict[int, dict[str, Any]]


@dataclass(frozen=True)
class Trained:
    """A task's result as the executor returned it, with what decoding it needs: the weights its client received
    (its version's broadcast) and the client's state when it started (its error-feedback residual)."""

    result: TaskResult
    received: torch.Tensor
    state: dict[str, Any]


@dataclass(frozen=True)
class Task:
    """A task in flight: its start order, client, the model version it started from and its times. ``finish_s`` is
    when it ends: its update arrives then, or, when ``arrives`` is false, its client goes offline then."""

    seq: int
    client_id: int
    version: int
    start_s: float
    finish_s: float
    arrives: bool = True


def check_async(clock: SyncClock | None, strategy: FedBuff, num_clients: int) -> None:
    """Refuse, in one line, what the asynchronous loop cannot run."""
    if clock is None:
        raise ValueError(
            f"strategy: {type(strategy).__name__} trains asynchronously on the simulated clock: add clock=sampled "
            "or clock=trace"
        )
    if clock.deadline_s is not None or clock.over_selection:
        raise ValueError(
            f"strategy: {type(strategy).__name__}: clock.deadline_s and clock.over_selection are for synchronous "
            "rounds; "
            "use no deadline and no over-selection"
        )
    if strategy.concurrency + strategy.buffer_size > num_clients:
        raise ValueError(
            f"strategy.concurrency + strategy.{strategy.buffer_setting} must be <= the {num_clients} clients (got "
            f"{strategy.concurrency} + {strategy.buffer_size}): a client whose update waits in the buffer "
            "does not train again before the server step"
        )


def event_loop(clock: SyncClock | None, strategy: object, num_clients: int, seed: int) -> BufferedLoop | None:
    """The event loop of an asynchronous strategy (refusing in one line what it cannot run); None for the others."""
    if not getattr(strategy, "asynchronous", False):
        return None
    buffered = cast(FedBuff, strategy)  # an asynchronous strategy has FedBuff's settings and step
    check_async(clock, buffered, num_clients)
    assert clock is not None  # check_async refuses a run without one
    return BufferedLoop(clock, buffered, seed)


class BufferedLoop:
    """The state of an asynchronous run between server steps (see the module docstring)."""

    def __init__(self, clock: SyncClock, strategy: FedBuff, seed: int) -> None:
        self.clock, self.strategy, self.seed = clock, strategy, seed
        self.version, self.started = 0, 0
        self.in_flight: list[Task] = []
        self.start_params: dict[int, torch.Tensor] = {}  # the weights of every version a task in flight started from
        self.results: dict[int, Trained] = {}  # by start order: trained, not yet consumed

    def step(self, parts: RoundParts, params: torch.Tensor, round_num: int) -> ServerStep:
        """Handle events until the strategy's buffer is full (``buffer_full``: ``buffer_size`` updates for FedBuff),
        then take one server step. Arrivals the server rejects (non-finite, wrong shape...) are dropped from the
        step, as from a synchronous round; a step left with no update keeps the model. So a run whose clients all
        diverge goes on, it does not wait for ever."""
        started_at, before = self.clock.now_s, self.started
        self.start_params.setdefault(self.version, params.clone())
        buffer, dropped_offline = self._arrivals(parts, round_num)
        consumed = (
            self._attacked(parts, round_num, buffer)
            if parts.attack
            else self._sound(parts, round_num, [(u, t) for u, t, _ in buffer])
        )
        taus = [self.version - t.version for _, t in consumed]
        deltas = [u.params - self.start_params[t.version] for u, t in consumed]
        new, from_strategy, per_client = params, {}, {}
        if consumed:  # as after a synchronous aggregate: the strategy's own scalars and values per client
            new = self.strategy.step(params, deltas, taus, [u.client_id for u, _ in consumed])
            from_strategy = checked_scalars(self.strategy, round_num)
            per_client = checked_client_values(self.strategy, round_num, [u for u, _ in consumed])
        started = [(u, self.start_params[t.version]) for u, t in consumed]
        self.version += 1
        self.start_params = {v: p for v, p in self.start_params.items() if any(t.version == v for t in self.in_flight)}
        self.start_params[self.version] = new.clone()
        metrics = {
            "sim/time_s": self.clock.now_s,
            "sim/round_s": self.clock.now_s - started_at,
            "sim/started": float(self.started - before),
            "sim/in_flight": float(len(self.in_flight)),
            "sim/dropped_offline": float(dropped_offline),
            "client/num_rejected": float(len(buffer) - len(consumed)),
        }
        if taus:
            metrics |= {"sim/staleness_mean": float(np.mean(taus)), "sim/staleness_max": float(max(taus))}
        if parts.attack is not None:
            metrics |= parts.attack.round_metrics(
                round_num, sorted(u.client_id for u, _, _ in buffer), [u for u, _ in consumed], None
            )
        return ServerStep(new, started, [u for u, _, _ in buffer], metrics | from_strategy, per_client)

    def _arrivals(self, parts: RoundParts, round_num: int) -> tuple[list[tuple[ClientUpdate, Task, Trained]], int]:
        """Events in (end time, start order) until the strategy's buffer is full (a failed task or a client
        gone offline sends nothing): the arrivals, each as :meth:`_received` gives it, with its task and its result
        as trained, and how many tasks ended with their client offline. New tasks start after each event, and when
        an idle client comes online while a slot is free."""
        buffer: list[tuple[ClientUpdate, Task, Trained]] = []
        dropped_offline = 0
        self._fill(parts, set())
        while not self.strategy.buffer_full([u.client_id for u, _, _ in buffer]):
            task = min(self.in_flight, key=lambda t: (t.finish_s, t.seq)) if self.in_flight else None
            wake = self._wake_s(parts, {t.client_id for _, t, _ in buffer})
            if task is None and wake == float("inf"):
                raise RuntimeError(
                    f"round {round_num}: every client waits in the buffer and none trains, but "
                    f"{type(self.strategy).__name__}.buffer_full is still false; it must become true "
                    "once every client's update has arrived"
                )
            if task is None or wake < task.finish_s:
                self.clock.now_s = wake
            else:
                if task.arrives and task.seq not in self.results:
                    self._train_pending(parts, round_num)
                self.in_flight.remove(task)
                self.clock.now_s = task.finish_s
                trained = self.results.pop(task.seq) if task.arrives else None
                update = None if trained is None else self._received(parts, round_num, task, trained)
                if update is not None and trained is not None:  # an update comes only with its training
                    buffer.append((update, task, trained))
                dropped_offline += not task.arrives
            self._fill(parts, {t.client_id for _, t, _ in buffer})
        return buffer, dropped_offline

    def _wake_s(self, parts: RoundParts, buffered: set[int]) -> float:
        """When a free slot can next be filled: the next time an idle client can start (:func:`next_start_s`; inf
        with every slot taken)."""
        if len(self.in_flight) >= self.strategy.concurrency:
            return float("inf")
        busy = {t.client_id for t in self.in_flight} | buffered
        return min(
            (
                next_start_s(self.clock.profiles, c, self.clock.now_s)
                for c in range(len(parts.clients))
                if c not in busy
            ),
            default=float("inf"),
        )

    def _fill(self, parts: RoundParts, buffered: set[int]) -> None:
        """Start new tasks until ``concurrency`` are in flight or no idle client is online, with clients drawn among
        the online ones neither training nor waiting in the buffer (a client's state is committed with the server
        step that uses its update, so a client trains again only from its committed state: what a resumed run
        reads too). A task whose client's window closes before it would finish ends then, without an update."""
        now = self.clock.now_s
        while len(self.in_flight) < self.strategy.concurrency:
            busy = {t.client_id for t in self.in_flight} | buffered
            idle = np.array(
                [c for c in range(len(parts.clients)) if c not in busy and can_start(self.clock.profiles, c, now)]
            )
            if idle.size == 0:
                return
            client = int(idle[np.random.default_rng([self.seed, _DOMAIN, self.started]).integers(len(idle))])
            epochs = int(parts.client_config(self.version, client).get("epochs", parts.clients[client].epochs))
            timing = self.clock.timing(
                client,
                epochs=epochs,
                num_train=parts.clients[client].num_train,
                model_bytes=parts.comm.down_bytes,
                update_bytes=parts.comm.up_bytes,
            )
            leaves = online_until(self.clock.profiles, client, now)
            arrives = leaves >= now + timing.total_s
            self.in_flight.append(
                Task(self.started, client, self.version, now, now + timing.total_s if arrives else leaves, arrives)
            )
            self.started += 1

    def _train_pending(self, parts: RoundParts, round_num: int) -> None:
        """Train every task in flight that has no result yet: one executor call per start version. The clients of a
        version receive its weights as the downlink encodes them (seeded by the version, as a synchronous round's
        broadcast by its round); each result is kept as trained, with what decoding it needs (:class:`Trained`)."""
        pending = [t for t in self.in_flight if t.arrives and t.seq not in self.results]
        for version in sorted({t.version for t in pending}):
            group = [t for t in pending if t.version == version]
            states = {t.client_id: parts.client_states.get(t.client_id) for t in group}
            tasks = [
                FitTask(
                    t.client_id,
                    t.seq + 1,
                    task_seed(self.seed, t.seq + 1, t.client_id),
                    parts.client_config(t.version, t.client_id, lr_round=t.version + 1),
                    task_state(states[t.client_id]),
                )
                for t in group
            ]
            received = parts.comm.broadcast(self.start_params[version], version + 1)
            results = parts.executor.fit(received, tasks)
            apply_failure_policy(round_num, list(results), parts.min_success_fraction, parts.logger)
            by_client = {r.client_id: r for r in results}
            for t in group:
                self.results[t.seq] = Trained(by_client[t.client_id], received, states[t.client_id])

    def _decoded(self, parts: RoundParts, task: Task, trained: Trained) -> TaskResult:
        """The task's update as the server decodes it (seeded by the task's start order, which is its
        ``round_num``), with the error-feedback residual in its new state (:class:`fedsim.server.exchange.Exchange`)."""
        return parts.comm.receive(trained.result, trained.received, self.start_params[task.version], trained.state)

    def _received(self, parts: RoundParts, round_num: int, task: Task, trained: Trained) -> ClientUpdate | None:
        """The task's update as it arrives (None when the task failed): decoded, or, in an attacked run, as trained,
        since the attack replaces updates before they are encoded (:meth:`_attacked`)."""
        result = trained.result if parts.attack is not None else self._decoded(parts, task, trained)
        return result if isinstance(result, ClientUpdate) else None

    def _sound(
        self, parts: RoundParts, round_num: int, arrived: Sequence[tuple[TaskResult, Task]]
    ) -> list[tuple[ClientUpdate, Task]]:
        """The updates that pass the server's checks against their start weights (the others logged)."""
        return [
            (u, t)
            for u, t in arrived
            if isinstance(u, ClientUpdate) and sound_updates(round_num, [u], self.start_params[t.version], parts.logger)
        ]

    def _attacked(
        self, parts: RoundParts, round_num: int, buffer: list[tuple[ClientUpdate, Task, Trained]]
    ) -> list[tuple[ClientUpdate, Task]]:
        """The buffer after the attack (:meth:`fedsim.attacks.stage.AttackStage.apply_buffer`): the malicious
        clients among its sound updates replace theirs, an omniscient attack seeing those updates, all honest; each
        is then encoded and decoded as it is sent, and checked again. One the server then rejects (a boosted
        update overflowing float16, say) is dropped from the step and logged, as in a synchronous round."""
        assert parts.attack is not None
        trained = {t.seq: b for _, t, b in buffer}
        sound = self._sound(parts, round_num, [(u, t) for u, t, _ in buffer])
        updates = parts.attack.apply_buffer(
            [u for u, _ in sound], [trained[t.seq].received for _, t in sound], round_num
        )
        return self._sound(
            parts,
            round_num,
            [
                (self._decoded(parts, t, replace(trained[t.seq], result=u)), t)
                for u, (_, t) in zip(updates, sound, strict=True)
            ],
        )

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (after a server step the buffer is empty and no result is pending)."""
        return {
            "version": self.version,
            "started": self.started,
            "in_flight": [asdict(t) for t in self.in_flight],
            "start_params": {str(v): p.clone() for v, p in self.start_params.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.version, self.started = int(state["version"]), int(state["started"])
        self.in_flight = [Task(**t) for t in state["in_flight"]]
        self.start_params = {int(v): p for v, p in state["start_params"].items()}
        self.results = {}
