"""A run's checkpoints: when they are due, what one holds (complete: a resumed run equals an uninterrupted one), and
reading one back for a resume (:mod:`fedsim.server.resume` puts the parts back)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import torch

from fedsim.core.checkpoint import CheckpointError, save_checkpoint, save_if_missing
from fedsim.core.checkpoint import resolve as resolve_checkpoint
from fedsim.observe.metrics_records import without_client_rows
from fedsim.server.parts import RoundParts
from fedsim.server.resume import continue_records, restore_parts
from fedsim.server.resume_check import check_changes, check_fingerprint
from fedsim.server.settings import Checkpoints
from fedsim.server.stage import RoundStage, Stateful

log = logging.getLogger("fedsim")


class RunCheckpoints:
    """Checkpoints of a run with ``parts`` whose round is ``stages``, as ``settings`` say (``None``: none written;
    a resume still reads one). ``settings`` (the run's dotted config keys, set by :mod:`fedsim.cli.run`): what a
    resume may not change silently (:mod:`fedsim.server.resume_check`)."""

    def __init__(self, settings: Checkpoints | None, parts: RoundParts, stages: Sequence[RoundStage]) -> None:
        self.dir = Path(settings.dir) if settings is not None else None
        self.every = settings.every if settings is not None else 0
        self.keep = settings.keep if settings is not None else 3
        self.parts, self.stages = parts, stages
        self.settings: dict[str, Any] = {}

    def due(self, round_num: int, last_round: int, stopping: bool) -> bool:
        """Whether a checkpoint is written after ``round_num``: every ``every`` rounds, after the last and on a stop."""
        if self.dir is None:
            return False
        return (self.every > 0 and round_num % self.every == 0) or round_num == last_round or stopping

    def entries(self) -> dict[str, Stateful]:
        """The stateful parts the round's stages own, by checkpoint entry (the clock, the byte ledger, a stage's), and
        the executor when it has a state (``executor=auto``'s choice)."""
        parts = {key: part for stage in self.stages for key, part in stage.checkpoint_parts().items()}
        executor = self.parts.executor
        if callable(getattr(executor, "state_dict", None)) and callable(getattr(executor, "load_state_dict", None)):
            parts["executor"] = cast(Stateful, executor)
        return parts

    def fingerprint(self, params: torch.Tensor) -> dict[str, int]:
        """What a checkpoint of another run setup differs in."""
        parts = self.parts
        return {
            "seed": parts.seed,
            "num_clients": len(parts.clients),
            "clients_per_round": parts.schedule.clients_per_round,
            "num_params": params.numel(),
        }

    def state_dict(self, round_num: int, params: torch.Tensor) -> dict[str, Any]:
        """Everything a resumed run needs after ``round_num``. Sampling, task seeds and stragglers are pure functions
        of (seed, round), so the round number stands for every random state."""
        parts = self.parts
        return {
            "round": round_num,
            "params": params.clone(),
            "strategy": parts.strategy.state_dict(),
            "history": without_client_rows(parts.logger.history),  # the rows live in metrics.jsonl
            "client_state_round": parts.client_states.round,  # its entries live in client_state/, versioned
            "fingerprint": self.fingerprint(params),
            "settings": self.settings,
            **{key: part.state_dict() for key, part in self.entries().items()},
        }

    def save(self, state: dict[str, Any]) -> Path:
        """Write ``state`` (a :meth:`state_dict`) as the checkpoint of its round."""
        assert self.dir is not None
        path = save_checkpoint(self.dir, state["round"], self._with_manifest(state), keep=self.keep)
        log.info("round %d: checkpoint %s", state["round"], path)
        return path

    def snapshot(self, round_num: int, params: torch.Tensor) -> dict[str, Any] | None:
        """:meth:`state_dict` after ``round_num``, kept in memory in case the next round fails; ``None`` without
        checkpoints or before round 1."""
        return self.state_dict(round_num, params) if self.dir is not None and round_num >= 1 else None

    def save_last_good(self, state: dict[str, Any] | None) -> None:
        """After an error: write the last completed round's checkpoint unless it is on disk already."""
        if state is not None and self.dir is not None:
            save_if_missing(self.dir, state["round"], self._with_manifest(state), keep=self.keep)

    def _with_manifest(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` with the client-state versions its round reads (what a resume checks before the first round);
        listed when the checkpoint is written, not per round, since it grows with the clients that have a state."""
        return state | {"client_state_manifest": self.parts.client_states.manifest(state["client_state_round"])}

    def resume(
        self,
        target: str | Path,
        params: torch.Tensor,
        allow_changes: Sequence[str],
        set_up: Callable[[int], None],
    ) -> tuple[Path, torch.Tensor, int]:
        """Read the checkpoint of ``target`` (a file, a checkpoints directory or a run directory: its newest good one)
        and put the run back as it recorded it: ``set_up(start_round)`` tells the strategy about the run first.
        Returns the checkpoint's path, its weights (as ``params``' dtype) and the round to continue at. A changed
        setting that shapes the computation (not in ``allow_changes``) or another run setup is refused in one line."""
        path, state = resolve_checkpoint(target)
        changes = check_changes(state.get("settings", {}), self.settings, allow_changes, path)
        check_fingerprint(state.get("fingerprint"), self.fingerprint(params), path)
        start_round = int(state["round"]) + 1
        set_up(start_round)  # the strategy is told again, before its state comes back
        try:
            self.parts.strategy.load_state_dict(state["strategy"])
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CheckpointError(
                f"{path}: its strategy state does not fit {type(self.parts.strategy).__name__} ({type(error).__name__}"
                f": {error}); resume with the strategy the run was started with"
            ) from None
        restore_parts(path, state, self.entries())
        if start_round <= self.parts.schedule.num_rounds:  # rounds are left: their records come back
            parts = self.parts
            assert parts.schedule.early_stop is not None  # the server gives the schedule one
            continue_records(
                path,
                state,
                changes,
                start_round=start_round,
                client_states=parts.client_states,
                logger=parts.logger,
                early_stop=parts.schedule.early_stop,
            )
        return path, state["params"].to(params.dtype), start_round
