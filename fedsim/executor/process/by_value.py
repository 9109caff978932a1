"""The start message of a process worker, with what cannot be found by name sent by value.

A spawned worker finds a class or function by its module and name. That fails for what a notebook or an
interactive session defines (its ``__main__`` is not a file the worker can import), for lambdas and for
functions or classes defined inside a function. Those travel by value instead, serialised by
`cloudpickle <https://github.com/cloudpipe/cloudpickle>`_ (their code, and the globals it uses); everything
else pickles as multiprocessing always does (tensors as shared memory). Within one message a class goes
once, so its instances in the worker share one rebuilt class.
"""

from __future__ import annotations

import io
import types
from multiprocessing.reduction import ForkingPickler
from typing import Any

import cloudpickle


def by_value(obj: object) -> bool:
    """Whether ``obj`` is a class or function a worker could not import by name."""
    if not isinstance(obj, (type, types.FunctionType)):
        return False
    qualname = getattr(obj, "__qualname__", "")
    return getattr(obj, "__module__", None) == "__main__" or "<lambda>" in qualname or "<locals>" in qualname


class _StartPickler(ForkingPickler):
    def reducer_override(self, obj: Any) -> Any:
        if by_value(obj):
            return cloudpickle.loads, (cloudpickle.dumps(obj),)
        return NotImplemented


def dumps(obj: object) -> bytes:
    """``obj`` pickled for a spawned worker; plain ``pickle.loads`` (with cloudpickle installed) reads it."""
    buffer = io.BytesIO()
    _StartPickler(buffer).dump(obj)
    return buffer.getvalue()
