"""The errors that stop a run, each with a one-line message that names the culprit."""

from __future__ import annotations

from pathlib import Path


class ConfigError(ValueError):
    """An invalid configuration value; ``str()`` is one line that names the field. (Also importable from
    :mod:`fedsim.cli.config`, which imports Hydra: this module imports nothing, so a worker can import it cheaply.)"""


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


class JobFailed(Exception):
    """A job of a multirun stopped (bad input, a failed run). Raised, not ``sys.exit``: Hydra records the job as
    failed and runs the others; the sweep then ends with this one line and exit status ``status``."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self) -> tuple[type[JobFailed], tuple[str, int]]:
        """Pickled with its status: a launcher that runs jobs in other processes (submitit) sends it back."""
        return (type(self), (str(self), self.status))


class RunWriteError(OSError):
    """A file of the run could not be written (disk full, read-only filesystem, ...). ``str()`` is one line naming
    the file and the system's reason; it stays an :class:`OSError`, so code that handles those still does."""

    def __init__(self, path: str | Path, error: OSError) -> None:
        super().__init__(error.errno, error.strerror or str(error), str(path))
        self.path = Path(path)

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


class DatasetNotFoundError(FileNotFoundError):
    """The dataset files are missing or unusable (or could not be downloaded); the message is one line (it names
    the dataset, the place looked in and where to get the files)."""
