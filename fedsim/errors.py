"""The errors that stop a run, each with a one-line message that names the culprit."""

from __future__ import annotations


class RoundFailedError(RuntimeError):
    """Too few clients of a round succeeded for the failure policy to aggregate."""


class ClientMisuseError(RoundFailedError):
    """A client broke a rule that keeps results independent of the executor (it changed ``self`` during a
    task, or left a state that a checkpoint cannot hold); stops the run whatever the failure policy."""


class StrategyError(RoundFailedError):
    """The strategy's ``aggregate`` (or ``round_metrics``) raised or returned something unusable; the message
    names the strategy."""


class WorkerStartupError(RuntimeError):
    """A worker process exited or stalled before it was ready to train. ``retryable``: it was killed by a
    signal or stalled (another start may succeed), not a worker that exited by itself (an import error, a
    missing ``__main__`` guard: another start would fail the same way)."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable
