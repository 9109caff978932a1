"""What a resume may change: the settings that shape the computation are compared with the checkpoint's.

A resumed run continues the interrupted one only if it computes the same thing. The checkpoint keeps the
run's settings as dotted keys (e.g. ``client.optimizer.lr``); a resume with any of them changed is refused
with one line listing the changes, unless each changed key is named in ``resume_allow_changes``. Allowed
changes are recorded in ``<run dir>/resume_changes.jsonl``. Settings that cannot change the result are
free: the executor (every executor gives the same answer), logging, checkpointing, where the server
evaluates, the state store, early stopping, the sweep objective and ``num_rounds`` (resume a finished run with more
rounds to extend it; not with a cosine learning-rate schedule over the run's rounds, whose rates it changes).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedsim.core.checkpoint import CheckpointError

FREE_PREFIXES = ("executor.", "logger.", "tracker.", "early_stop.", "hydra.", "objective.")
# settings added after checkpoints began to keep them, with the value that computes what older versions did: a
# checkpoint without the key was written with that value
ADDED_LATER = {
    "compression.uplink": [],
    "compression.downlink": [],
    "compression.error_feedback": False,
    "attack.fraction": 0.2,
    "attack.per_round": False,
    "round.extra": [],
    "data.tokenizer_kind": "bpe",  # the text readers' data.tokenizer=train keys: unused with a tokenizer file
    "data.vocab_size": 8000,
    "model.dtype": "float32",  # a language model's precision keys (fedsim.models.precision, client.autocast)
    "model.gradient_checkpointing": False,
    "client.autocast": None,
    "client.local_steps": None,
    "client.lr_schedule._target_": "fedsim.client.LrSchedule",
    "client.lr_schedule.kind": "constant",
    "client.lr_schedule.gamma": 0.99,
    "client.lr_schedule.step_rounds": 10,
    "client.lr_schedule.min_lr": 0.0,
    "client.lr_schedule.num_rounds": None,
}
TOKENIZER_HASH = "data.tokenizer_sha256"
"""A setting that is no config key: the SHA-256 of ``<run dir>/tokenizer.json`` in a run with
``data.tokenizer=train`` (:mod:`fedsim.cli.run_tokenizer`), so that a resume with another file is refused."""
FREE_KEYS = {
    "resume",
    "resume_allow_changes",
    "num_rounds",
    "checkpoint_every",
    "keep_checkpoints",
    "eval_device",
    "state_store",
    "server_threads",
}


def computation_settings(flat: dict[str, Any]) -> dict[str, Any]:
    """The settings (dotted keys, plain values) that a resume must not change silently. ``num_rounds`` is one of them
    when a cosine learning-rate schedule spans the run's rounds (``client.lr_schedule.num_rounds=null``): every
    round's rate depends on it then."""
    cosine = flat.get("client.lr_schedule.kind") == "cosine" and flat.get("client.lr_schedule.num_rounds") is None
    free = FREE_KEYS - {"num_rounds"} if cosine else FREE_KEYS
    return {k: v for k, v in sorted(flat.items()) if k not in free and not k.startswith(FREE_PREFIXES)}


def check_changes(
    saved: dict[str, Any], current: dict[str, Any], allowed: Iterable[str], checkpoint: Path
) -> dict[str, list[Any]]:
    """The changed settings (key → [checkpoint's value, now]); :class:`CheckpointError` (one line) when one is not
    in ``allowed``. Nothing to compare (a checkpoint from before settings were kept, or the Python API
    without a config) means no check."""
    if not saved or not current:
        return {}
    saved = {**{k: v for k, v in ADDED_LATER.items() if k in current}, **saved}
    changes = {
        k: [saved.get(k), current.get(k)] for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)
    }
    refused = [k for k in changes if k not in set(allowed)]
    if TOKENIZER_HASH in refused:
        raise CheckpointError(
            f"resume from {checkpoint}: the run directory's tokenizer.json is not the tokenizer the run trained "
            "(data.tokenizer=train; its SHA-256 differs); put the run's own tokenizer.json back, or start a new run"
        )
    if refused:
        listed = ", ".join(f"{k} ({_show(changes[k][0])} -> {_show(changes[k][1])})" for k in refused)
        raise CheckpointError(
            f"resume from {checkpoint}: these settings differ from the run being resumed: {listed}; resume with the "
            f"run's settings, or allow the change with resume_allow_changes=[{','.join(refused)}]"
        )
    return changes


def check_fingerprint(saved: dict[str, Any] | None, current: dict[str, int], checkpoint: Path) -> None:
    """:class:`CheckpointError` (one line naming what differs) when the checkpoint's run had another shape: seed,
    number of clients, clients per round or size of the federated vector. :func:`check_changes` runs first and
    names the setting behind such a difference; this is what is left without settings (the Python API) or when
    the change was allowed but cannot be resumed (e.g. ``adapter.r``)."""
    if saved == current:
        return
    saved = saved or {}
    listed = ", ".join(
        f"{k} ({_show(saved.get(k))} -> {_show(current.get(k))})"
        for k in sorted(set(saved) | set(current))
        if saved.get(k) != current.get(k)
    )
    raise CheckpointError(
        f"{checkpoint} belongs to another run setup: {listed}; resume with the setup it was written with"
    )


def record_changes(run_dir: Path | None, checkpoint: Path, round_num: int, changes: dict[str, list[Any]]) -> None:
    """Append one line to ``<run dir>/resume_changes.jsonl``: which checkpoint, from which round, what changed."""
    if not changes or run_dir is None:
        return
    line = {"checkpoint": str(checkpoint), "resumed_after_round": round_num, "changes": changes}
    with open(Path(run_dir) / "resume_changes.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")


def _show(value: Any) -> str:
    return "unset" if value is None else repr(value)
