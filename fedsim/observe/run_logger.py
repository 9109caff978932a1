"""Run observability: TensorBoard event files, ``metrics.jsonl``, a progress bar and one log line per evaluation.

Scalars share their names across TensorBoard and ``metrics.jsonl`` (e.g. ``train/loss``,
``eval/accuracy``, ``time/round_s``), grouped by prefix; a user's client metrics are ``fit/<name>`` and a
strategy's scalars ``strategy/<name>`` (see :mod:`fedsim.server.round_metrics`). The round's bookkeeping
(``client/num_sampled``, ...) is shown in TensorBoard under ``participants/``
(see :mod:`fedsim.observe.tensorboard_log`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from tqdm import tqdm

with warnings.catch_warnings():  # in Jupyter without ipywidgets, tqdm.contrib.logging's import of tqdm.auto warns
    warnings.simplefilter("ignore")  # "IProgress not found"; fedsim's progress bar is the plain one
    from tqdm.contrib.logging import logging_redirect_tqdm

from fedsim.client.evaluation import csv_text, describe
from fedsim.core.checkpoint import write_text_atomic
from fedsim.core.errors import RunWriteError
from fedsim.core.run_lock import Lease, hold
from fedsim.core.storage import closing_naming_errors, naming_write_errors, quiet_writer_thread_errors
from fedsim.core.types import ClientScore
from fedsim.observe.metrics_records import add_client_rows, read_records, without_client_rows
from fedsim.observe.tensorboard_log import (
    add_axis_scalars,
    after_existing_files,
    is_counter,
    label_distribution_image,
    shown_hparams,
    tensorboard_tag,
    write_hparams,
)

log = logging.getLogger("fedsim")


class RunLogger:
    """Writes one record per round to ``run_dir/metrics.jsonl`` and ``run_dir/tensorboard``.

    With ``run_dir=None`` nothing is written to disk (the history is still kept in memory). The directory is the
    logger's from construction to :meth:`close`: another process's logger or run there is refused with
    :class:`~fedsim.core.run_lock.RunDirectoryInUse` (:mod:`fedsim.core.run_lock`).
    ``progress=None`` shows the bar only on a terminal. ``client_rows_in_memory=False`` keeps only each round's
    scalars in :attr:`history`: the per-client rows (about 0.6 KiB per client and round as Python objects, so 60 MB
    over 1,000 rounds of 100 clients) then live only in ``metrics.jsonl``, where :func:`read_records` finds them, and
    memory stays flat however long the run. ``python -m fedsim`` runs this way.
    """

    def __init__(
        self,
        run_dir: str | Path | None = None,
        *,
        tensorboard: bool = True,
        progress: bool | None = None,
        client_rows_in_memory: bool = True,
    ) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.progress = progress
        self.client_rows_in_memory = client_rows_in_memory
        self._tensorboard = tensorboard
        self.history: list[dict[str, Any]] = []
        self._clients: list[dict[str, Any]] = []
        self._writer = None
        self._jsonl = None
        self._fresh = False  # metrics.jsonl still holds what was there before this run
        self._failed = False  # a write failed (close() then does not raise again)
        self._bar: tqdm | None = None
        self._counters_shown: set[str] = set()  # counters that were non-zero once: in TensorBoard from then on
        self._lease: Lease | None = None
        if self.run_dir is not None:
            self._lease = hold(self.run_dir)  # another process's run there: refused before anything is written
            # not truncated yet: a resumed run reads the per-client rows back from it (see restore)
            self._jsonl = open(self.run_dir / "metrics.jsonl", "a+", encoding="utf-8")  # noqa: SIM115 - closed by close()
            self._fresh = True
            if tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                quiet_writer_thread_errors()
                with self._writing(self.run_dir / "tensorboard"):
                    self._writer = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))

    def restore(self, history: list[dict[str, Any]], next_round: int, earlier: Path | None = None) -> None:
        """Continue a resumed run: ``metrics.jsonl`` is rewritten to exactly ``history``, and TensorBoard
        drops whatever an interrupted run had logged from ``next_round`` on (``purge_step``), so every
        tag keeps exactly one value per round.

        Checkpoints keep the history without its per-client rows (they would make every checkpoint grow
        with rounds × clients); those come back from ``earlier``, the interrupted run's ``metrics.jsonl``,
        for every round whose scalars match it. A round whose rows cannot be found is kept without them,
        with one warning."""
        records = [dict(record) for record in history]
        missing = add_client_rows(records, read_records(earlier) if earlier is not None else {})
        if missing:
            log.warning(
                "resume: the per-client rows of %d round(s) were not found in %s; those rounds keep their scalars only",
                missing,
                earlier,
            )
        if self._jsonl is not None:  # replaced atomically: a full disk must not cost the interrupted run's rows
            path = Path(self._jsonl.name)
            self._jsonl.close()
            with self._writing(path):
                write_text_atomic(path, "".join(json.dumps(record) + "\n" for record in records))
            self._jsonl = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - closed by close()
            self._fresh = False
        self.history = records if self.client_rows_in_memory else without_client_rows(records)
        self._counters_shown = {k for r in records for k, v in r.items() if is_counter(k) and v}
        if self._writer is not None:
            from torch.utils.tensorboard import SummaryWriter

            with self._writing(Path(self._writer.log_dir)):
                self._writer.close()
                after_existing_files(Path(self._writer.log_dir))
                self._writer = SummaryWriter(log_dir=self._writer.log_dir, purge_step=next_round)
                for record in (
                    records
                ):  # by_sim_time/ and vs_kb_sent/ steps are seconds and kB: the purge dropped those >= next_round
                    add_axis_scalars(self._writer, record, first_step=next_round)

    def rounds(self, first: int, last: int) -> Iterator[int]:
        """Iterate rounds ``first..last`` under a progress bar; log lines go above the bar, at the console's
        level and through its filters (tqdm's handler would print everything: ``logger=quiet`` shows only warnings,
        and third-party lines stay in ``run.log``)."""
        root = logging.getLogger()
        console = [
            h for h in root.handlers if isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr)
        ]
        with logging_redirect_tqdm(loggers=[root]):
            root.handlers[-1].setLevel(console[0].level if console else logging.NOTSET)  # tqdm's, for the console's
            root.handlers[-1].filters = list(console[0].filters) if console else []  # what it kept off the console
            disable = None if self.progress is None else not self.progress
            self._bar = tqdm(range(first, last + 1), desc="rounds", unit="round", disable=disable)
            yield from self._bar
            self._bar.close()

    def log_config(self, text: str) -> None:
        """Record the resolved configuration as TensorBoard text."""
        if self._writer is not None:
            with self._writing(Path(self._writer.log_dir)):
                self._writer.add_text("config", f"```\n{text}\n```", 0)

    def log_text(self, tag: str, text: str, round_num: int) -> None:
        """Record free text (failures, warnings) in TensorBoard and the log file."""
        log.warning("round %d %s: %s", round_num, tag, text.splitlines()[0] if text else "")
        if self._writer is not None:
            with self._writing(Path(self._writer.log_dir)):
                self._writer.add_text(tag, f"```\n{text}\n```", round_num)

    def log_clients(self, round_num: int, rows: list[dict[str, Any]]) -> None:
        """Per-client details of a round (id, examples, train loss, per-epoch losses, worker, device, the
        client's own ``metrics``).

        They go into the round's ``metrics.jsonl`` record under ``"clients"`` and, as histograms over the
        clients, into TensorBoard: ``client/train_loss``, ``client/update_norm`` and ``client/fit/<name>``
        for each client metric of the user's (its round mean is the scalar ``fit/<name>``; a tag holds
        either scalars or histograms, never both), and ``client/strategy/<name>`` for the strategy's per-client values
        (:meth:`fedsim.strategy.Strategy.client_metrics`, under ``"strategy"`` in a row).
        """
        self._clients = rows
        if self._writer is None:
            return
        for key in ("train_loss", "update_norm"):
            self._histogram(tensorboard_tag(f"client/{key}"), [r.get(key) for r in rows], round_num)
        for field, prefix in (("metrics", "client/fit"), ("strategy", "client/strategy")):
            names = dict.fromkeys(name for r in rows for name in r.get(field, {}))
            for name in names:
                self._histogram(
                    tensorboard_tag(f"{prefix}/{name}"), [r.get(field, {}).get(name) for r in rows], round_num
                )

    def log_client_scores(self, round_num: int, scores: list[ClientScore], personal: bool) -> None:
        """An every-client evaluation (:mod:`fedsim.client.evaluation`): each client's values to
        ``client_eval/round-<NNNN>.csv``, and their histograms to TensorBoard (``eval_global/client_accuracy``,
        ``/client_loss``, and ``eval_personal/...`` with personal models)."""
        if self.run_dir is not None:
            path = self.run_dir / "client_eval" / f"round-{round_num:04d}.csv"
            with self._writing(path):
                path.parent.mkdir(exist_ok=True)
                write_text_atomic(path, csv_text(scores, personal))
        families = [("eval_global", "loss", "accuracy")] + (
            [("eval_personal", "personal_loss", "personal_accuracy")] if personal else []
        )
        for prefix, loss, accuracy in families:
            self._histogram(f"{prefix}/client_accuracy", [getattr(s, accuracy) for s in scores], round_num)
            self._histogram(f"{prefix}/client_loss", [getattr(s, loss) for s in scores], round_num)

    def _histogram(self, tag: str, values: list[Any], round_num: int) -> None:
        """A TensorBoard histogram of the finite ``values``; nothing when there are none."""
        finite = [v for v in values if v is not None and math.isfinite(v)]
        if self._writer is not None and finite:
            with self._writing(Path(self._writer.log_dir)):
                self._writer.add_histogram(tag, np.asarray(finite), round_num)

    def log_label_distribution(self, label_counts: np.ndarray) -> None:
        """The partition at round 0 as the image ``partition/label_distribution``: a heatmap of the first 200
        clients' label shares (see :func:`fedsim.observe.tensorboard_log.label_distribution_image`)."""
        if self._writer is None or label_counts.size == 0:
            return
        image = label_distribution_image(label_counts[:200])
        with self._writing(Path(self._writer.log_dir)):
            self._writer.add_image("partition/label_distribution", image, 0, dataformats="HWC")

    def log_hparams(self, settings: dict[str, Any], results: dict[str, Any]) -> None:
        """This run's row in TensorBoard's HParams dashboard, in the run's own event files: the settings that
        were set or swept and the final metrics (see :func:`fedsim.observe.tensorboard_log.write_hparams`)."""
        if self.run_dir is not None and self._tensorboard is not False:
            with self._writing(self.run_dir / "tensorboard"):
                write_hparams(self.run_dir / "tensorboard", shown_hparams(settings, self.run_dir), results)

    def log_round(self, round_num: int, metrics: dict[str, float]) -> None:
        """Record one round's scalars everywhere; print a line when the round was evaluated."""
        record: dict[str, Any] = {"round": round_num, **{k: _plain(v) for k, v in metrics.items()}}
        if self._clients:
            record["clients"], self._clients = self._clients, []
        self.history.append(record if self.client_rows_in_memory else without_client_rows([record])[0])
        if self._jsonl is not None:
            with self._writing(Path(self._jsonl.name)):
                if self._fresh:  # a new run: whatever an earlier run left in this directory goes
                    self._jsonl.seek(0)
                    self._jsonl.truncate()
                    self._fresh = False
                self._jsonl.write(json.dumps(record) + "\n")
                self._jsonl.flush()
        if self._writer is not None:
            with self._writing(Path(self._writer.log_dir)):
                for name, value in metrics.items():
                    if is_counter(name) and name not in self._counters_shown:
                        if not value:
                            continue  # a counter that was always zero so far: no chart of zeros
                        self._counters_shown.add(name)
                    self._writer.add_scalar(tensorboard_tag(name), value, round_num)
                add_axis_scalars(self._writer, metrics)
        if "eval/accuracy" in metrics:
            self._show_eval(round_num, metrics)
        clients_line = describe(metrics)
        if clients_line is not None:
            log.info("round %d: %s", round_num, clients_line)

    def _show_eval(self, round_num: int, metrics: dict[str, float]) -> None:
        """The round's test line: accuracy first, or for a token task (``eval/perplexity``) perplexity, then the
        token accuracy."""
        acc, perplexity = metrics["eval/accuracy"], metrics.get("eval/perplexity")
        shown = f"test accuracy {acc:.4f}"
        if perplexity is not None:
            shown = f"test perplexity {perplexity:.4f}, token accuracy {acc:.4f}"
        log.info(
            "round %d: %s, test loss %.4f, train loss %.4f",
            round_num,
            shown,
            metrics.get("eval/loss", math.nan),
            metrics.get("train/loss", math.nan),
        )
        if self._bar is not None and perplexity is not None:
            self._bar.set_postfix(ppl=f"{perplexity:.4f}")
        elif self._bar is not None:
            self._bar.set_postfix(acc=f"{acc:.4f}")

    def close(self) -> None:
        """Flush and close files; safe to call twice. A write that fails here raises :class:`RunWriteError`,
        unless an earlier write failed or another error is on its way up (then it is only logged)."""
        problems = []
        if self._writer is not None:
            writer, self._writer = self._writer, None
            problems.append(closing_naming_errors(lambda: _finish_tensorboard(writer), Path(writer.log_dir)))
        if self._jsonl is not None:
            jsonl, self._jsonl = self._jsonl, None
            problems.append(closing_naming_errors(jsonl.close, Path(jsonl.name)))
        if self._lease is not None:
            lease, self._lease = self._lease, None
            lease.release()
        problem = next((p for p in problems if p is not None), None)
        if problem is not None and (self._failed or sys.exc_info()[1] is not None):
            log.warning("%s", problem)
        elif problem is not None:
            raise problem

    @contextlib.contextmanager
    def _writing(self, path: Path) -> Iterator[None]:
        """Writes to ``path`` inside: an :class:`OSError` becomes a :class:`RunWriteError` naming it."""
        try:
            with naming_write_errors(path):
                yield
        except RunWriteError:
            self._failed = True
            raise

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def process_rss_mb() -> float:
    """Resident memory of this process in MiB (Linux ``/proc``; NaN elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def _plain(value: float) -> float | int | None:
    """JSON-safe scalar: ints stay ints, NaN/inf become None."""
    if isinstance(value, int):
        return value
    value = float(value)
    return value if math.isfinite(value) else None


def _finish_tensorboard(writer: Any) -> None:
    """Flush (which raises what the writer's thread failed with) and close a ``SummaryWriter``."""
    try:
        writer.flush()
    finally:
        writer.close()
