"""The Ray executor: persistent Ray actors on one machine or a cluster (:class:`RayExecutor` in ``executor.py``; one
actor's body in ``actor.py``; why an actor did not start or answer, in one line, in ``reasons.py``; the idle actors
kept for the next run, ``reuse_actors``, in ``warm.py``).

This package is ``fedsim.executor.ray``; the Ray library stays ``ray`` (every import in fedsim is absolute), and
nothing here imports it before a :class:`RayExecutor` is made."""

from fedsim.executor.ray.executor import RayExecutor
from fedsim.executor.ray.warm import release_warm_actors

__all__ = ["RayExecutor", "release_warm_actors"]
