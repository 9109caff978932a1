"""One semantics for ``self``: a ``Client`` must be the same at the start of every task.

Under the serial executor the server's own client objects train; under the process and Ray executors
each worker trains its own copy. A client that changed its attributes during a task would therefore see
its change again in a later task under one executor and not under another: the run would depend on the
executor, silently. So every executor compares a client's attributes before and after each task and turns
a change into one fatal error that names the attribute and points to client state, which is the way to
keep per-client values across rounds.

An attribute that only carries a value *within* one task (set at the start of ``fit``, read by ``loss``, e.g.
the weights the task started from) is declared in the class's ``task_attributes``: it is put back to its
value from before the task when the task ends, so it never carries over either, and it is not an error.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

from fedsim.client.base import Client

_UNPICKLABLE = object()
_SCRATCH = "\0task_attributes"  # the snapshot's entry for the declared task attributes


def snapshot(client: Client) -> dict[str, Any]:
    """Each attribute of ``client`` as pickled bytes (a nested change shows), or its identity when it does
    not pickle (e.g. a lambda optimizer factory under the serial executor); ``task_attributes`` as copies."""
    scratch = set(type(client).task_attributes)
    prints = {name: _fingerprint(value) for name, value in vars(client).items() if name not in scratch}
    prints[_SCRATCH] = {name: copy.deepcopy(vars(client)[name]) for name in scratch if name in vars(client)}
    return prints


def restore_task_attributes(client: Client, before: dict[str, Any]) -> None:
    """Put the declared ``task_attributes`` back as they were before the task (removing ones it added)."""
    saved = before[_SCRATCH]
    for name in type(client).task_attributes:
        if name in saved:
            setattr(client, name, saved[name])
        else:
            vars(client).pop(name, None)


def _fingerprint(value: Any) -> Any:
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - anything that does not pickle is compared by identity
        return (_UNPICKLABLE, id(value))


def changed_attribute(client: Client, before: dict[str, Any]) -> str | None:
    """The first attribute (sorted by name) that a task added, removed or changed, or ``None``."""
    scratch = set(type(client).task_attributes)
    after = {name: value for name, value in vars(client).items() if name not in scratch}
    for name in sorted((set(before) - {_SCRATCH}) | set(after)):
        if name not in before or name not in after or _fingerprint(after[name]) != before[name]:
            return name
    return None


def mutation_message(client: Client, attribute: str) -> str:
    """The one-line error for a client that changed ``self.<attribute>`` during a task."""
    return (
        f"{type(client).__qualname__} changed self.{attribute} during a task (client {client.client_id}): a Client "
        "must be the same at the start of every task, or results would differ between executors; keep values that "
        "live across rounds in client state (the `state` dict that fit() receives), or declare an attribute that only "
        "holds a value within one task in task_attributes (docs/writing-a-strategy.md, 'Client state')"
    )
