"""Workers started before the run: forked and building their model while the server builds everything else.

:meth:`ProcessExecutor.prepare` knows only the model factory; a background thread forks the workers (which waits
until the forkserver has finished its imports) and sends each ``("model", factory)``, so that their model builds,
imports included (``transformers`` and PEFT for a LoRA model: ~4 CPU s each), overlap with the server's own
building. :meth:`EarlyStart.take` hands them to ``start()`` if the run's workload has that factory and log
directory; otherwise, and on :meth:`EarlyStart.cancel`, they are killed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedsim.executor.base import Workload
from fedsim.executor.process.pool import WorkerHandle, model_message, spawn_worker

if TYPE_CHECKING:
    from multiprocessing.context import ForkServerContext, SpawnContext


class EarlyStart:
    """Workers of ``plan`` (device, threads) being forked from a thread, each sent ``model_factory`` to build."""

    def __init__(
        self,
        ctx: ForkServerContext | SpawnContext,
        plan: list[tuple[str, int]],
        model_factory: Callable[[], Any],
        log_dir: Path | None,
    ) -> None:
        self.model_factory, self.log_dir, self.size = model_factory, log_dir, len(plan)
        payload = model_message(model_factory)  # here: a factory that cannot be pickled is not started early
        self.handles: list[WorkerHandle] = []
        self.error: BaseException | None = None
        self._cancelled = threading.Event()
        self._thread = threading.Thread(
            target=self._launch, args=(ctx, plan, payload), name="fedsim-early-workers", daemon=True
        )
        self._thread.start()

    def _launch(self, ctx: ForkServerContext | SpawnContext, plan: list[tuple[str, int]], payload: bytes) -> None:
        try:
            for index, (device, threads) in enumerate(plan):
                handle = spawn_worker(ctx, index, device, threads, self.log_dir)
                self.handles.append(handle)
                if self._cancelled.is_set():
                    break
                handle.send_model(payload)
        except BaseException as error:  # noqa: BLE001 - start() launches afresh, and reports what fails again
            self.error = error
        if self._cancelled.is_set():
            self._kill()

    def take(self, workload: Workload) -> list[WorkerHandle] | None:
        """The workers, once all are forked, if they build ``workload``'s model and log into its directory; else
        ``None``, and the early ones are killed."""
        self._thread.join()
        fits = workload.model_factory is self.model_factory and workload.log_dir == self.log_dir
        if self.error is None and fits and len(self.handles) == self.size:
            handles, self.handles = self.handles, []  # start()'s from now on: cancel() no longer touches them
            return handles
        self.cancel()
        return None

    def cancel(self) -> None:
        """Kill the workers forked so far without waiting for the thread (it kills any it forks from now on)."""
        self._cancelled.set()
        self._kill()

    def _kill(self) -> None:
        for handle in list(self.handles):
            handle.kill()
