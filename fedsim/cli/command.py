"""The ``fedsim`` command: Hydra composes the configuration, :mod:`fedsim.cli.run` builds and runs it, and every
expected way to stop ends with one line on stderr and a documented exit status: 2 for bad input before any
work, 1 for a run that failed (a round, a worker, a write), 130 for an interrupted run."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any, NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from fedsim.cli.dir_lock import release_command_line_leases
from fedsim.cli.hydra_entry import fail, run_hydra_entry
from fedsim.cli.hydra_mode import mode_read_from_the_command_line
from fedsim.cli.library_output import library_output_to_run_log
from fedsim.cli.objective import objective_value
from fedsim.cli.run import CONFIG_DIR, build_server
from fedsim.cli.run_summary import record_error, record_summary, write_failed_summary
from fedsim.cli.sweep_check import sweep_arguments
from fedsim.core.checkpoint import CheckpointError, resume_hint
from fedsim.core.errors import ConfigError, JobFailed, RoundFailedError, WorkerStartupError
from fedsim.core.run_lock import Lease, RunDirectoryInUse, hold
from fedsim.core.storage import LogFileErrors, is_write_failure, write_failure_text, write_remedy
from fedsim.observe.run_names import register_run_label_resolver
from fedsim.server.server import RunResult, Server

register_run_label_resolver()  # conf/config.yaml names a sweep's job directories with ${fedsim_run_label:}


@hydra.main(config_path=CONFIG_DIR, config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float:
    """One run; returns the objective (fedsim/cli/objective.py) for sweepers such as Optuna."""
    run_dir = HydraConfig.get().runtime.output_dir
    # the run's directory is its own; a full disk: run.log's failures are not a traceback per line; library warnings
    # go to run.log only
    with _own(run_dir), LogFileErrors() as log_file, library_output_to_run_log():
        history = _run_from_command_line(cfg, run_dir)
    if log_file.first is not None:
        print(
            f"fedsim: warning: {log_file.first}; that log misses lines (the run's own files are complete)",
            file=sys.stderr,
        )
    return objective_value(history, cfg.objective.metric, cfg.objective.reduce)


def _own(run_dir: str) -> Lease:
    """The run's lease on its directory (a single run's callback took it already: the same lock, shared); a
    directory another process holds stops this run, or this job of a sweep, in one line, and writes nothing there."""
    try:
        return hold(run_dir)
    except RunDirectoryInUse as error:
        _stop(str(error), 2)


def _stop(message: str, status: int, run_dir: str | None = None) -> NoReturn:
    """End a single run with one line and ``status``. In a multirun, raise :class:`JobFailed` instead, so that the
    other jobs run; a job that failed before its first round gets a ``summary.json`` saying why (``run_dir``)."""
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        fail(message, status)
    if run_dir is not None:
        write_failed_summary(run_dir, message)
    raise JobFailed(message, status)


def _run_from_command_line(cfg: DictConfig, run_dir: str) -> list[dict[str, Any]]:
    """Build and run ``cfg``; every expected failure ends the run with one line (exit 2 before any work, 1 after).
    Returns the run's history (its rounds' scalars)."""
    try:
        server = build_server(cfg, run_dir)
    except (ValueError, FileNotFoundError, CheckpointError) as error:  # ConfigError is a ValueError
        _stop(str(error), 2, run_dir)
    except OSError as error:  # e.g. resume_changes.jsonl or metrics.jsonl on a full disk
        if not is_write_failure(error):
            raise
        _stop(
            f"{write_failure_text(error, run_dir)}; {write_remedy(error, run_dir)} or choose another hydra.run.dir", 2
        )
    if server.finished:
        print(
            "fedsim: nothing to do: the run in "
            f"{cfg.resume if isinstance(cfg.resume, str) and cfg.resume != 'auto' else run_dir} "
            f"finished all {server.num_rounds} rounds; to train longer, resume with a larger num_rounds",
            file=sys.stderr,
        )
        return server.logger.history
    start = time.perf_counter()
    with _stop_on_signals(server):  # restored afterwards: the next multirun job must not reach this server
        try:
            result = server.run()
        except KeyboardInterrupt:
            print("fedsim: interrupted; workers stopped (no checkpoint for the unfinished round)", file=sys.stderr)
            sys.exit(130)
        except Exception as error:  # summary.json: finished false, the error as stop_reason
            record_error(server, cfg, run_dir, time.perf_counter() - start, error)
            if is_write_failure(error):  # a full disk: the newest checkpoint is intact
                resumed_from = None if cfg.resume in (None, False, True, "auto") else cfg.resume
                _stop(f"{write_failure_text(error, run_dir)}; {resume_hint(run_dir, error, resumed_from)}", 1)
            if not isinstance(error, (RoundFailedError, WorkerStartupError)):
                raise  # not a round failure (a bug?): keep the traceback
            _stop(str(error), 1)
        summary = _record_final_summary(server, result, cfg, run_dir, time.perf_counter() - start)
    if result.stopped_early:
        print(
            f"fedsim: interrupted: stopped after round {summary['rounds']}, checkpoint in {run_dir}/checkpoints; "
            f"continue with resume={run_dir}",
            file=sys.stderr,
        )
        sys.exit(130)
    print(_final_line(summary, run_dir))
    return result.history


def _final_line(summary: dict[str, Any], run_dir: str) -> str:
    """The command's last line: the final test accuracy, or for a token task the perplexity (token accuracy after)."""
    if "final_perplexity" in summary:
        return (
            f"final test perplexity: {summary['final_perplexity']:.4f} (token accuracy "
            f"{summary['final_accuracy']:.4f}, best perplexity {summary['best_perplexity']:.4f}, "
            f"{summary['rounds']} rounds, {summary['wall_time_s']:.1f} s) -> {run_dir}"
        )
    return (
        f"final test accuracy: {summary['final_accuracy']:.4f} (best {summary['best_accuracy']:.4f}, "
        f"{summary['rounds']} rounds, {summary['wall_time_s']:.1f} s) -> {run_dir}"
    )


def _record_final_summary(
    server: Server, result: RunResult, cfg: DictConfig, run_dir: str, wall_time_s: float
) -> dict[str, Any]:
    """:func:`record_summary` for the command line: a failed write is one line (the run itself is complete)."""
    try:
        return record_summary(server, result, cfg, run_dir, wall_time_s)
    except OSError as error:
        if not is_write_failure(error):
            raise
        _stop(
            f"{write_failure_text(error, run_dir)}; the rounds, checkpoints and metrics.jsonl are complete: "
            f"{write_remedy(error, run_dir)} before the next run",
            1,
        )


@contextlib.contextmanager
def _stop_on_signals(server: Server) -> Iterator[None]:
    """While inside: the first Ctrl-C / SIGTERM finishes the round, checkpoints and exits; a second one
    aborts at once. On leaving, the previous handlers come back (a handler left behind would keep the
    finished server, its data and its executor alive through the next jobs of a multirun)."""

    def handle(signum: int, frame: object) -> None:
        if server.stop_requested:
            raise KeyboardInterrupt
        print("fedsim: stopping after the current round (signal again to abort now)", file=sys.stderr)
        server.request_stop()

    previous = {signum: signal.signal(signum, handle) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``fedsim``); Hydra failing to write the run directory is one line too.

    ``argv`` (the arguments after the program name; default: ``sys.argv[1:]``) runs the command line in this
    process, e.g. from a notebook or a test: the same output, files and exit statuses (as ``SystemExit``)."""
    saved = sys.argv
    if argv is not None:
        sys.argv = [saved[0] if saved else "fedsim", *argv]  # Hydra reads its overrides from sys.argv
    try:
        try:  # a sweep's overrides checked against every swept option (fedsim/cli/sweep_check.py)
            sys.argv = [sys.argv[0], *sweep_arguments(sys.argv[1:])]
        except ConfigError as error:
            fail(str(error), 2)
        with mode_read_from_the_command_line(sys.argv[1:]):  # one composition, not two (fedsim/cli/hydra_mode.py)
            run_hydra_entry(_hydra_main)
    finally:
        sys.argv = saved
        release_command_line_leases()  # the run's and the sweep's directories (fedsim.cli.dir_lock)
