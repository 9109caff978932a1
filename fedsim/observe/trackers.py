"""Experiment trackers: a run's config, per-round scalars and summary also sent to MLflow or Weights & Biases.

A :class:`TrackedLogger` is a :class:`~fedsim.observe.run_logger.RunLogger` that also forwards to its trackers.
Both libraries are optional extras (``pip install 'fedsim-torch[mlflow]'`` / ``'fedsim-torch[wandb]'``; in a
source checkout ``pip install -e '.[mlflow]'``), imported only when a tracker is made; the command line picks one
with ``tracker=mlflow|wandb`` (docs/trackers.md)."""

from __future__ import annotations

import atexit
import logging
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from fedsim.core.extras import require
from fedsim.observe.run_logger import RunLogger

log = logging.getLogger("fedsim")


def _require(module: str, extra: str) -> Any:
    """Import ``module`` or raise :class:`~fedsim.core.extras.MissingExtraError` naming
    ``pip install 'fedsim-torch[extra]'``."""
    return require(module, f"tracker={extra}", extra, package=module.split(".")[0])


class TrackerError(ValueError):
    """A tracker that cannot start (unreachable server, bad URI or mode): one line, before any training."""


def _first_line(error: BaseException) -> str:
    """The error in one line: its first line, or for a pydantic ``ValidationError`` (wandb's settings) every line
    but the link, joined."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    if type(error).__name__ == "ValidationError":
        lines = [" ".join(line for line in lines if not line.startswith("For further information"))]
    return f"{type(error).__name__}: {lines[0]}"


def _check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """For an ``http(s)://`` tracking URI, a :class:`TrackerError` when nothing answers there within ``timeout_s``
    (MLflow's client would retry for minutes). Any HTTP answer, an error status included, means a server is there."""
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return  # a server answered
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise TrackerError(
            f"tracker=mlflow: no MLflow server answers at tracker.tracking_uri={uri} within {timeout_s:g} s "
            f"({reason}); start it, fix the URI, or run without a tracker (tracker=none)"
        ) from None


class Tracker:
    """Where a run's config, per-round scalars and summary also go. ``run_dir`` (``None`` for a run without
    one) is where a tracker keeps local files unless told otherwise."""

    def start(self, run_name: str, config: dict[str, Any], run_dir: Path | None = None) -> None:
        """Open the tracker's run and record the run's settings (a nested dict)."""
        raise NotImplementedError

    def log_round(self, round_num: int, scalars: dict[str, float]) -> None:
        """Record one round's finite scalars (flat names such as ``eval/accuracy``) at step ``round_num``."""
        raise NotImplementedError

    def finish(self, summary: dict[str, Any], ok: bool) -> None:
        """Record the run's summary and close its run, as failed when not ``ok``."""
        raise NotImplementedError


class MLflowTracker(Tracker):
    """An MLflow run in ``experiment``: config → params (scalar leaves as dotted keys), per-round scalars →
    metrics (step = round), summary → metrics (numbers) and tags (the rest); status FINISHED or FAILED.

    ``tracking_uri``: any MLflow URI; unset, ``MLFLOW_TRACKING_URI`` if set, else the file store
    ``<run dir>/mlruns``. For ``file:`` URIs ``MLFLOW_ALLOW_FILE_STORE`` defaults to true (MLflow 3 refuses
    its file store without it)."""

    client: Any  # an mlflow.tracking.MlflowClient once started (mlflow is an optional extra)

    def __init__(
        self, tracking_uri: str | None = None, experiment: str = "fedsim", run_name: str | None = None
    ) -> None:
        _require("mlflow", "mlflow")  # fail at build time, before any training
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.uri, self.client, self.run_id = "", None, ""  # set by start()

    def start(self, run_name: str, config: dict[str, Any], run_dir: Path | None = None) -> None:
        self.uri = (
            self.tracking_uri
            or os.environ.get("MLFLOW_TRACKING_URI")
            or (Path(run_dir or ".") / "mlruns").resolve().as_uri()
        )
        if self.uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        _check_reachable(self.uri)
        try:
            self.client = _require("mlflow.tracking", "mlflow").MlflowClient(self.uri)
            run = self.client.create_run(self._experiment_id(), run_name=self.run_name or run_name)
        except Exception as error:  # noqa: BLE001 - MLflow raises many kinds; the run must stop in one line
            raise TrackerError(
                f"tracker=mlflow: cannot start a run at tracker.tracking_uri={self.uri} ({_first_line(error)})"
            ) from None
        self.run_id = run.info.run_id
        # MLflow keeps at most 6000 characters of a parameter's value: longer ones end with "..."
        self._batch(
            params={
                k: str(v) if len(str(v)) <= 6000 else str(v)[:5997] + "..." for k, v in flat_scalars(config).items()
            }
        )

    def _experiment_id(self) -> str:
        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(self.experiment)
        except Exception:  # noqa: BLE001 - another run created it meanwhile
            return self.client.get_experiment_by_name(self.experiment).experiment_id

    def _batch(
        self,
        metrics: dict[str, float] | None = None,
        step: int = 0,
        params: dict[str, str] | None = None,
        tags: dict[str, str] | None = None,
    ) -> None:
        """``log_batch`` calls within MLflow's limits: 1000 metrics, 100 params, 100 tags (8000 characters) each."""
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        for kind, rows, size in (
            ("metrics", [Metric(mlflow_key(k), v, now, step) for k, v in (metrics or {}).items()], 1000),
            ("params", [Param(mlflow_key(k), v) for k, v in (params or {}).items()], 100),
            ("tags", [RunTag(mlflow_key(k), v[:8000]) for k, v in (tags or {}).items()], 100),
        ):
            for i in range(0, len(rows), size):
                self.client.log_batch(self.run_id, **{kind: rows[i : i + size]})

    def log_round(self, round_num: int, scalars: dict[str, float]) -> None:
        self._batch(metrics=scalars, step=round_num)

    def finish(self, summary: dict[str, Any], ok: bool) -> None:
        numbers = finite_scalars(summary)
        self._batch(metrics=numbers, tags={k: str(v) for k, v in summary.items() if k not in numbers})
        self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")


class WandbTracker(Tracker):
    """A W&B run: config → ``run.config`` (nested as composed), per-round scalars → history (step = round),
    summary → ``run.summary``; exit code 0 or 1. ``mode="offline"`` (the default) writes
    ``<dir>/wandb/offline-run-*`` without a network or a login (``wandb sync`` uploads it later);
    ``dir`` defaults to the run directory; ``settings`` go to ``wandb.Settings``."""

    run: Any  # the wandb run once started (wandb is an optional extra)

    def __init__(
        self,
        project: str = "fedsim",
        mode: str = "offline",
        dir: str | None = None,
        entity: str | None = None,
        run_name: str | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        _require("wandb", "wandb")  # fail at build time, before any training
        self.project, self.mode, self.dir, self.entity, self.run_name = project, mode, dir, entity, run_name
        self.settings, self.run = dict(settings or {}), None

    def start(self, run_name: str, config: dict[str, Any], run_dir: Path | None = None) -> None:
        wandb = _require("wandb", "wandb")
        where = self.dir or run_dir
        if where is not None:
            Path(where).mkdir(parents=True, exist_ok=True)
        try:
            self.run = wandb.init(
                project=self.project,
                entity=self.entity,
                mode=self.mode,
                dir=None if where is None else str(where),
                name=self.run_name or run_name,
                config=config,
                settings=wandb.Settings(**self.settings),
            )
        except Exception as error:  # noqa: BLE001 - wandb raises pydantic's and its own errors
            raise TrackerError(
                f"tracker=wandb: cannot start a run (mode={self.mode!r}): {_first_line(error)}"
            ) from None

    def log_round(self, round_num: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=round_num)

    def finish(self, summary: dict[str, Any], ok: bool) -> None:
        self.run.summary.update(summary)
        self.run.finish(exit_code=0 if ok else 1)


class TrackedLogger(RunLogger):
    """A :class:`RunLogger` that also sends the run to ``trackers``.

    The trackers start at the first :meth:`log_config` or :meth:`log_round` (with ``config``, the run's
    settings as a nested dict), get every round's finite scalars (``None``, NaN and infinities are left out:
    the trackers' plots have no gaps to show them; ``metrics.jsonl`` keeps them) and end at :meth:`close`,
    or, with ``summary_follows=True``, at :meth:`log_hparams`, whose ``results`` are the summary (what
    ``fedsim.cli.run`` does: it writes the summary after the rounds). A summary that never comes (a killed
    run) ends them as failed at interpreter exit. A tracker that fails after its start is dropped with a
    warning: tracking never stops the training.
    """

    def __init__(
        self,
        run_dir: str | Path | None = None,
        *,
        trackers: Sequence[Tracker] = (),
        config: dict[str, Any] | None = None,
        run_name: str | None = None,
        summary_follows: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(run_dir, **kwargs)
        self.trackers, self.config, self.summary_follows = list(trackers), dict(config or {}), summary_follows
        self.run_name = run_name or default_run_name(self.run_dir)
        self._state = "new"  # -> "started" -> "finished"

    def log_config(self, text: str) -> None:
        super().log_config(text)
        self._start()

    def log_round(self, round_num: int, metrics: dict[str, float]) -> None:
        super().log_round(round_num, metrics)
        self._start()
        self._each(lambda tracker: tracker.log_round(round_num, finite_scalars(metrics)), f"round {round_num}")

    def log_hparams(self, hparams: dict[str, Any], results: dict[str, Any]) -> None:
        try:
            super().log_hparams(hparams, results)
        finally:
            self._finish(results, ok=not str(results.get("stop_reason", "")).startswith("error"))

    def close(self) -> None:
        try:
            super().close()
        finally:
            if not self.summary_follows:
                self._finish({}, ok=sys.exc_info()[1] is None)
            elif self._state == "started":
                atexit.register(self._finish, {"stop_reason": "no summary (killed?)"}, False)

    def start(self) -> None:
        """Start the trackers now (else at the first :meth:`log_config` or :meth:`log_round`): a tracker that cannot
        start raises :class:`TrackerError` before any training. Starting twice does nothing."""
        self._start()

    def _start(self) -> None:
        if self._state == "new":
            self._state = "starting"  # a tracker that cannot start stops the run before any work; none is finished
            for tracker in self.trackers:
                tracker.start(self.run_name, self.config, self.run_dir)
            self._state = "started"

    def _finish(self, summary: dict[str, Any], ok: bool) -> None:
        if self._state == "started":
            self._state = "finished"
            atexit.unregister(self._finish)
            self._each(lambda tracker: tracker.finish(summary, ok), "the summary")

    def _each(self, call: Any, what: str) -> None:
        """``call(tracker)`` for every tracker; one that raises is warned about and dropped."""
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as error:  # noqa: BLE001 - tracking must not end a run
                log.warning("%s failed on %s and is dropped: %s", type(tracker).__name__, what, error)
                self.trackers.remove(tracker)


def make_logger(cfg: Any, run_dir: str | Path | None, **logger_kwargs: Any) -> RunLogger:
    """The run's logger: a plain :class:`RunLogger`, or a :class:`TrackedLogger` when ``cfg.tracker`` has a
    ``_target_`` (instantiated with Hydra; a missing library is one line naming the extra to install)."""
    node = cfg.get("tracker")
    if node is None or node.get("_target_") is None:
        return RunLogger(run_dir, **logger_kwargs)
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    try:
        tracker = instantiate(node, _convert_="all")
    except InstantiationException as error:  # a missing library: its one line, not Hydra's wrapping
        raise (error.__cause__ if isinstance(error.__cause__, ValueError) else error) from None
    return TrackedLogger(
        run_dir,
        trackers=[tracker],
        config=cast("dict[str, Any]", OmegaConf.to_container(cfg, resolve=True)),  # cfg: a DictConfig
        summary_follows=run_dir is not None,
        **logger_kwargs,
    )


def default_run_name(run_dir: Path | None) -> str:
    """The last two parts of the run directory (Hydra's ``<date>/<time>`` or ``<time>/<job>``), else ``fedsim``."""
    return "/".join(Path(run_dir).resolve().parts[-2:]) if run_dir is not None else "fedsim"


def finite_scalars(values: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of ``values`` (``None``, NaN, infinities, booleans and non-numbers left out)."""
    return {
        k: v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def flat_scalars(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """The scalar leaves (str, number, bool, None) of a nested dict as dotted keys; lists are left out."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flat_scalars(value, f"{prefix}{key}."))
        elif value is None or isinstance(value, (str, int, float, bool)):
            flat[f"{prefix}{key}"] = value
    return flat


def mlflow_key(key: str) -> str:
    """A name MLflow accepts: characters other than letters, digits, ``_-./`` and space become ``_``; 250 at most."""
    return re.sub(r"[^\w.\-/ ]", "_", key)[:250]
