"""Kept at this path for researchers' code (docs/scaling-out.md named it): :func:`release_warm_actors` lives in
:mod:`fedsim.executor.ray`."""

from fedsim.executor.ray import release_warm_actors

__all__ = ["release_warm_actors"]
