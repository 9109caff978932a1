"""A run's ``summary.json`` (and its TensorBoard HParams entry): written when the run ends, completed, stopped early,
interrupted or failed, and for a multirun job refused before its first round."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from fedsim.core.checkpoint import write_text_atomic
from fedsim.core.errors import RoundFailedError
from fedsim.server.server import RunResult, Server

log = logging.getLogger("fedsim")


def flat_hparams(cfg: DictConfig) -> dict[str, Any]:
    """The run's settings as dotted keys (e.g. ``client.optimizer.lr``) for TensorBoard's HParams dashboard."""
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = node

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return flat


def record_summary(
    server: Server,
    result: RunResult | None,
    cfg: DictConfig,
    run_dir: str | Path | None,
    wall_time_s: float,
    error: BaseException | None = None,
) -> dict[str, Any]:
    """Write ``summary.json`` and the HParams entry of a run that ended (completed, stopped early or interrupted),
    or that stopped on ``error`` (then ``result`` is ``None``: not finished, ``stop_reason`` is ``"error: <one line>"``
    and the other fields come from the rounds completed so far)."""
    if error is None:
        assert result is not None
        summary = {
            **summarize(result, wall_time_s),
            "finished": not result.stopped_early,
            "stop_reason": result.stop_reason,
        }
    else:
        so_far = RunResult(server.params, server.model, server.logger.history)
        summary = {**summarize(so_far, wall_time_s), "finished": False, "stop_reason": f"error: {error_line(error)}"}
    if run_dir is not None:
        write_text_atomic(Path(run_dir) / "summary.json", json.dumps(summary, indent=2) + "\n")
        server.logger.log_hparams(flat_hparams(cfg), summary)
    return summary


def write_failed_summary(run_dir: str | Path, message: str) -> None:
    """``summary.json`` of a job that stopped before its first round (bad input in a multirun), so that the sweep's
    report lists it as failed with ``message``; a failure to write it is only logged."""
    summary = {
        "rounds": 0,
        "final_accuracy": None,
        "final_loss": None,
        "best_accuracy": None,
        "wall_time_s": 0.0,
        "finished": False,
        "stop_reason": f"error: {message}",
    }
    try:
        write_text_atomic(Path(run_dir) / "summary.json", json.dumps(summary, indent=2) + "\n")
    except OSError as error:
        log.warning("could not write summary.json: %s", error)


def record_error(
    server: Server, cfg: DictConfig, run_dir: str | Path | None, wall_time_s: float, error: BaseException
) -> None:
    """:func:`record_summary` for a run stopped by ``error``; a failure to write it never hides ``error``."""
    try:
        record_summary(server, None, cfg, run_dir, wall_time_s, error=error)
    except Exception as problem:  # noqa: BLE001
        log.warning("could not write summary.json after the error: %s", problem)


def error_line(error: BaseException) -> str:
    """One line for ``summary.json``: a round failure's own message, else the error's type and first line."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    return first if isinstance(error, RoundFailedError) or not text else f"{type(error).__name__}: {first}"


def summarize(result: RunResult, wall_time_s: float) -> dict[str, float | int | None]:
    """Final and best test accuracy, final test loss, rounds and wall time of a finished run; for a token task
    (``eval/perplexity`` logged) also ``final_perplexity`` and ``best_perplexity`` (the lowest)."""
    evaluated = [r for r in result.history if r.get("eval/accuracy") is not None]
    summary: dict[str, float | int | None] = {
        "rounds": len(result.history),
        "final_accuracy": evaluated[-1]["eval/accuracy"] if evaluated else None,
        "final_loss": evaluated[-1]["eval/loss"] if evaluated else None,
        "best_accuracy": max(r["eval/accuracy"] for r in evaluated) if evaluated else None,
        "wall_time_s": wall_time_s,
    }
    perplexities = [r["eval/perplexity"] for r in evaluated if r.get("eval/perplexity") is not None]
    if perplexities:
        summary["final_perplexity"] = perplexities[-1]
        summary["best_perplexity"] = min(perplexities)
    return summary
