"""A run's round, put together once when the server is built: the built-in stages (:data:`~fedsim.server.stage.
SYNC_STAGES`, or an asynchronous strategy's :data:`~fedsim.server.stage.ASYNC_STAGES`), the optional capabilities'
stages and the researcher's own (``Stages(extra=...)``, ``round.extra``), each at its position, with their names
and declarations checked in one line before any work."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from fedsim.server.async_round import BufferedStep
from fedsim.server.buffered import BufferedLoop
from fedsim.server.capabilities import capability_stages
from fedsim.server.central_eval import evaluate_global
from fedsim.server.federated_eval import evaluate_clients
from fedsim.server.measure import Measure, MeasureStep
from fedsim.server.parts import RoundParts
from fedsim.server.round import Aggregate, CommitStates, Dispatch, Evaluate, Plan, Receive, Upload
from fedsim.server.stage import CLOCK, UPDATES, RoundStage, check_declarations, check_names, place


def compose_round(parts: RoundParts, loop: BufferedLoop | None, extra: Sequence[RoundStage]) -> list[RoundStage]:
    """The round of a run with ``parts`` (``loop``: an asynchronous strategy's event loop, else ``None``) and the
    researcher's ``extra`` stages; refuses, in one line naming the stage, a bad name, position or declaration."""
    evaluate = Evaluate(
        functools.partial(evaluate_global, parts.evaluator, parts.test_data),
        functools.partial(evaluate_clients, parts),
        every=parts.evaluation.every,
        num_rounds=parts.schedule.num_rounds,
        client_eval=parts.evaluation.clients,
    )
    base: list[RoundStage] = (
        [BufferedStep(loop, parts), CommitStates(parts), MeasureStep(), evaluate]
        if loop is not None
        else [Plan(parts), Dispatch(parts), Upload(parts), Receive(parts), Aggregate(parts), CommitStates(parts)]
        + [Measure(), evaluate]
    )
    stages = place(base, capability_stages(parts, asynchronous=loop is not None))
    check_names(stages, extra)
    stages = place(stages, extra)
    clock = parts.clock is not None or loop is not None
    check_declarations(stages, {UPDATES, CLOCK} if clock else {UPDATES})
    return stages
