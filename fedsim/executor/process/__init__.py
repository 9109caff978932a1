"""The process executor: persistent worker processes, forked from a preloaded forkserver, that train clients in
parallel (:class:`ProcessExecutor` in ``executor.py``; the parent's side of each worker in ``pool.py``, the worker's
own loop in ``worker.py``; the forkserver and what it imports in ``forkserver.py`` and ``preload.py``; what a worker
cannot import by name travels by value, ``by_value.py``)."""

from fedsim.executor.process.executor import ProcessExecutor

__all__ = ["ProcessExecutor"]
