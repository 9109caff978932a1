"""Warm Ray actors kept by one run for the next in the same driver process (``RayExecutor(reuse_actors=True)``).

A new actor is a new Python process that imports Ray, torch and fedsim and builds its model: seconds per actor. A
run that reuses actors hands its healthy, idle ones over here at its end (each has dropped its workload); the next
run's :func:`take` gets them back if they were made with the same CPUs and GPUs on the same Ray, and kills the
ones it does not take, so that no idle actor holds resources a run needs. Ray's shutdown ends them all.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from fedsim.executor.ray.reasons import kill_quietly


@dataclass
class _Kept:
    job: Any = None  # the Ray job (one per ray.init) the actors belong to
    shape: tuple[int, float] | None = None  # (threads, GPUs) of each actor
    actors: list[Any] = field(default_factory=list)


_kept = _Kept()


def take(ray: Any, threads: int, gpus: float, count: int) -> list[Any]:
    """Up to ``count`` kept actors of this shape on this Ray; every other kept actor is killed."""
    job = ray.get_runtime_context().get_job_id()
    actors, same = _kept.actors, (_kept.job, _kept.shape) == (job, (threads, gpus))
    taken = actors[:count] if same else []
    if _kept.job == job:  # on another Ray (shut down since), they are gone already
        for actor in actors[len(taken) :]:
            kill_quietly(ray, actor)
    _kept.job, _kept.shape, _kept.actors = None, None, []
    return taken


def keep(ray: Any, threads: int, gpus: float, actors: list[Any]) -> None:
    """Keep ``actors`` (idle, released) for the next run in this process."""
    _kill_kept(ray)
    _kept.job, _kept.shape, _kept.actors = ray.get_runtime_context().get_job_id(), (threads, gpus), list(actors)


def release_warm_actors() -> int:
    """Kill the Ray actors that a run with ``reuse_actors`` kept for the next one, freeing their CPUs and GPUs for
    other work on the same Ray (they also end with ``ray.shutdown()`` or this process). Returns how many there were."""
    ray = sys.modules.get("ray")
    count = len(_kept.actors)
    if ray is not None:
        _kill_kept(ray)
    return count


def _kill_kept(ray: Any) -> None:
    actors, _kept.actors, _kept.job, _kept.shape = _kept.actors, [], None, None
    if ray.is_initialized():
        for actor in actors:
            kill_quietly(ray, actor)
