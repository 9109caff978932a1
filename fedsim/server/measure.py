"""The ``measure`` stage: a round's client rows and training metrics, from what reached the server. It knows no
capability: the codecs' bytes, an attack's flags and counts, DP's and DP-SGD's privacy and the clock's times come
from those capabilities' own stages (a contract in pyproject.toml keeps this module from importing them)."""

from __future__ import annotations

from fedsim.server.record import RoundRecord
from fedsim.server.round_metrics import client_row, train_metrics, with_strategy_values
from fedsim.server.stage import RoundStage


class Measure(RoundStage):
    """The round's client rows (each checked update's, with what stages added for it and the strategy's values) and
    its training metrics: losses and examples, the strategy's scalars, rejected and aggregated counts."""

    name, needs = "measure", frozenset()  # the rows report what reached the server

    def run(self, record: RoundRecord) -> None:
        rows = [client_row(u, record.start_params) | record.client_extras.get(u.client_id, {}) for u in record.updates]
        record.rows = with_strategy_values(rows, record.client_values) if record.client_values is not None else rows
        record.metrics.update(train_metrics(record.updates, len(record.results)) | record.from_strategy)
        record.metrics["client/num_rejected"] = float(len(record.succeeded) - len(record.updates))
        record.metrics["client/num_aggregated"] = float(len(record.kept))
        record.evaluated_ids = record.client_ids


class MeasureStep(RoundStage):
    """An asynchronous server step's client rows (each against the weights its client started from) and metrics."""

    name, needs = "measure", frozenset()  # the rows report what reached the server

    def run(self, record: RoundRecord) -> None:
        rows = [client_row(u, started) | record.client_extras.get(u.client_id, {}) for u, started in record.consumed]
        record.rows = with_strategy_values(rows, record.client_values or {})
        record.metrics = train_metrics(record.updates, len(record.results)) | record.metrics
        record.metrics["client/num_aggregated"] = float(len(record.updates))
        record.evaluated_ids = sorted({u.client_id for u in record.updates})  # a client may arrive twice
