"""``data.tokenizer=train`` in a run directory: the tokenizer a run trains on its training split is saved as
``<run dir>/tokenizer.json``; a resumed run reads that file back (never trains again) and refuses it in one line when
it is gone or is no longer the file the run trained (its SHA-256 is one of the checkpoint's settings)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from omegaconf import DictConfig

from fedsim.cli.config import ConfigError
from fedsim.core.checkpoint import write_text_atomic
from fedsim.server.resume_check import TOKENIZER_HASH

TRAIN, TOKENIZER_FILE = "train", "tokenizer.json"
"""``data.tokenizer=train``, and the file in the run directory that holds the tokenizer it trained."""


def _trains(cfg: DictConfig, run_dir: str | Path | None) -> bool:
    return cfg.data.get("tokenizer") == TRAIN and "tokenizer_kind" in cfg.data and run_dir is not None


def trained_tokenizer(cfg: DictConfig, run_dir: str | Path | None, target: str | Path | None) -> dict[str, str]:
    """The data's arguments for ``data.tokenizer=train`` in ``run_dir``: a fresh run (``target`` None) trains the
    tokenizer and saves it as ``<run dir>/tokenizer.json`` (``tokenizer_file``); a run resumed from ``target`` (a
    checkpoint file, a checkpoints directory or a run directory) reads the file its run saved (``tokenizer``) and never
    trains again. A resume from another run's directory copies that file into ``run_dir``, so that this run resumes
    too. Nothing for any other tokenizer, or without a run directory."""
    if not _trains(cfg, run_dir):
        return {}
    assert run_dir is not None
    own = Path(run_dir) / TOKENIZER_FILE
    if target is None:
        return {"tokenizer_file": str(own)}
    target = Path(target)
    resumed_dir = (
        target.parent.parent if target.is_file() else target.parent if target.name == "checkpoints" else target
    )
    saved = resumed_dir / TOKENIZER_FILE
    if not saved.is_file():
        raise ConfigError(
            f"resume: data.tokenizer=train, but {saved}, the tokenizer the run trained, is missing; put the run's "
            "tokenizer.json back, or start a new run"
        )
    if saved.resolve() != own.resolve():
        write_text_atomic(own, saved.read_text(encoding="utf-8"))
    return {"tokenizer": str(saved)}


def tokenizer_setting(cfg: DictConfig, run_dir: str | Path | None) -> dict[str, str]:
    """``{TOKENIZER_HASH: SHA-256 of <run dir>/tokenizer.json}`` for a run with ``data.tokenizer=train`` (after
    :func:`trained_tokenizer` wrote or copied it), kept with the run's settings so that a resume whose file was
    changed is refused (:mod:`fedsim.server.resume_check`); nothing otherwise."""
    own = Path(run_dir) / TOKENIZER_FILE if run_dir is not None else None
    if not _trains(cfg, run_dir) or own is None or not own.is_file():
        return {}
    return {TOKENIZER_HASH: hashlib.sha256(own.read_bytes()).hexdigest()}
