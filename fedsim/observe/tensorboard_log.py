"""What fedsim shows in TensorBoard, apart from writing it (:class:`fedsim.observe.run_logger.RunLogger` writes).

* **Tags.** Scalars keep their ``metrics.jsonl`` names, except that the round's bookkeeping (``client/num_sampled``,
  ``client/num_failed``, ... and the per-client histograms ``client/train_loss``, ...) is shown under
  ``participants/``, the bytes (``comm/``) under ``traffic/``, the privacy (``dp/``) under ``privacy/`` and the
  attack's counts (``attack/``) under ``robustness/``:
  TensorBoard orders its groups alphabetically, and those would come before ``eval/``, the test accuracy and loss
  a researcher looks at first. A counter appears from its first non-zero value on,
  so runs without failures or rejections show no constant-zero charts (``metrics.jsonl`` keeps every value).
* **HParams.** One entry per run, written into the run's own event files (not a ``hparams`` sub-run): the keys set
  on the command line (Hydra's ``.hydra/overrides.yaml`` of the run directory) plus ``strategy`` and ``seed``,
  booleans as booleans, integers as their digits (the dashboard prints numbers as ``0.0000``), a config group
  as its option's name or, where another class ran (``strategy._target_=my_module.MyStrategy``), that class, and
  the run's final metrics (:data:`HPARAMS_METRICS`).
* **Simulated time.** A run on the simulated clock (``clock=sampled|trace``: its rounds log ``sim/time_s``) also gets
  :data:`SIM_TIME_SCALARS` under ``by_sim_time/`` (``by_sim_time/eval/accuracy``, ...) with the step = the simulated
  clock at the end of the round in whole seconds, ``int(round(sim/time_s))`` (TensorBoard's steps are integers; two
  rounds ending within the same second share a step), so TensorBoard's step axis is simulated time there. A run
  without a clock gets nothing more.
* **Communication.** Every run counts its bytes (``comm/mb_total``), and the same scalars appear under
  ``vs_kb_sent/`` with the step = the kilobytes sent both ways so far: accuracy against communication.
* **Label distribution.** A heatmap (client × class, share of the client's examples) with axes, a colour bar and a
  title, drawn with matplotlib; without matplotlib, a plain grey bitmap (one cell per client and class).
"""

from __future__ import annotations

import functools
import io
import logging
import math
import numbers
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

log = logging.getLogger("fedsim")

BOOKKEEPING_PREFIX = "client/"
SHOWN_PREFIX = "participants/"
# TensorBoard names of metric groups that would sort before eval/: the round's bookkeeping, bytes and privacy
SHOWN_AS = {BOOKKEEPING_PREFIX: SHOWN_PREFIX, "comm/": "traffic/", "dp/": "privacy/", "attack/": "robustness/"}
ALWAYS_SHOWN = ("strategy", "seed")  # in every run's HParams row, set or not
NOT_SHOWN = ("logger", "hydra", "resume", "resume_allow_changes")  # output and restart settings, not the experiment's
# the HParams dashboard's metric columns: scalar tag -> column title. It shows each tag's last value, so the
# final test accuracy and loss are the round scalars' own; the others are summary.json's (see write_hparams)
HPARAMS_METRICS = {
    "eval/accuracy": "final accuracy",
    "summary/best_accuracy": "best accuracy",
    "eval/loss": "final loss",
    "summary/rounds": "rounds",
    "summary/wall_time_s": "wall time (s)",
}


SIM_TIME = "sim/time_s"  # the simulated clock at the end of the round (fedsim.sim.clock)
SIM_TIME_PREFIX = "by_sim_time/"
SIM_TIME_SCALARS = ("eval/accuracy", "eval/loss", "train/loss")  # also shown against simulated time and bytes
COMM_MB = "comm/mb_total"  # megabytes sent both ways so far (fedsim.server.exchange)
COMM_PREFIX = "vs_kb_sent/"


def sim_time_scalars(metrics: Mapping[str, Any]) -> list[tuple[str, float, int]]:
    """``(tag, value, step)`` of a round's :data:`SIM_TIME_SCALARS` against simulated time: ``by_sim_time/<name>``
    at step ``int(round(sim/time_s))``, for the names the round logged (``null``, as in ``metrics.jsonl``, reads
    as NaN, as the round's own scalar was written). Empty without a finite ``sim/time_s`` (no clock)."""
    return _against(metrics, SIM_TIME, 1.0, SIM_TIME_PREFIX)


def comm_scalars(metrics: Mapping[str, Any]) -> list[tuple[str, float, int]]:
    """The same scalars against communication: ``vs_kb_sent/<name>`` at step = the run's cumulative kilobytes both
    ways, ``int(round(1000 · comm/mb_total))`` (every run counts its bytes: :mod:`fedsim.server.exchange`)."""
    return _against(metrics, COMM_MB, 1000.0, COMM_PREFIX)


def _against(metrics: Mapping[str, Any], axis: str, scale: float, prefix: str) -> list[tuple[str, float, int]]:
    position = metrics.get(axis)
    if not isinstance(position, numbers.Real) or isinstance(position, bool) or not math.isfinite(position):  # numpy too
        return []
    step = int(round(float(position) * scale))
    return [
        (prefix + name, math.nan if metrics[name] is None else float(metrics[name]), step)
        for name in SIM_TIME_SCALARS
        if name in metrics
    ]


def add_sim_time_scalars(writer: Any, metrics: Mapping[str, Any], first_step: int = 0) -> None:
    """Write :func:`sim_time_scalars` of one round with ``writer`` (a ``SummaryWriter``), those at steps from
    ``first_step`` on. A resumed run's writer is opened with ``purge_step=next_round``, which drops every tag's
    events from that step on, so also the kept rounds' simulated-time points from second ``next_round`` on:
    calling this for each kept round with ``first_step=next_round`` writes exactly those back. (Should rounds
    average under a simulated second, points of the dropped rounds below that step stay.)"""
    for tag, value, step in sim_time_scalars(metrics):
        if step >= first_step:
            writer.add_scalar(tag, value, step)


def add_axis_scalars(writer: Any, metrics: Mapping[str, Any], first_step: int = 0) -> None:
    """:func:`add_sim_time_scalars` and the same for :func:`comm_scalars` (steps in kilobytes, which a resumed
    writer's purge drops in the same way)."""
    add_sim_time_scalars(writer, metrics, first_step)
    for tag, value, step in comm_scalars(metrics):
        if step >= first_step:
            writer.add_scalar(tag, value, step)


def after_existing_files(log_dir: Path) -> None:
    """Wait (at most a second) until a new event file in ``log_dir`` sorts after the existing ones.

    TensorBoard reads a directory's event files in name order, ``events.out.tfevents.<unix second>.<host>.<pid>.<n>``
    with ``n`` counting this process's writers: a resume in the same process and second as the run it continues
    (the Python API, a notebook) could get ``….10`` after ``….9``, which sorts first, and its purge of the abandoned
    rounds would be read before them."""
    seconds = [
        int(p.name.split(".")[3]) for p in log_dir.glob("events.out.tfevents.*") if p.name.split(".")[3].isdigit()
    ]
    while seconds and int(time.time()) <= max(seconds):
        time.sleep(0.05)


def tensorboard_tag(name: str) -> str:
    """The TensorBoard tag of a ``metrics.jsonl`` name: ``client/...`` becomes ``participants/...``, ``comm/...``
    ``traffic/...``, ``dp/...`` ``privacy/...`` and ``attack/...`` ``robustness/...`` (:data:`SHOWN_AS`)."""
    for prefix, shown in SHOWN_AS.items():
        if name.startswith(prefix):
            return shown + name[len(prefix) :]
    return name


def is_counter(name: str) -> bool:
    """A round's bookkeeping count (``client/num_failed``, ...): shown from its first non-zero value on."""
    return name.startswith(BOOKKEEPING_PREFIX + "num_")


def shown_hparams(settings: dict[str, Any], run_dir: Path | None) -> dict[str, Any]:
    """The HParams row of a run: what was set or swept, from all its ``settings`` (dotted keys, plain values).

    A run started by the ``fedsim`` command shows the keys of its command-line overrides (read from Hydra's
    ``<run dir>/.hydra/overrides.yaml``) and :data:`ALWAYS_SHOWN`; a config group (``strategy=fedprox``) shows
    the option's name, unless the class that ran is another: a ``<group>._target_`` set on the command line, or
    one outside fedsim, shows the class (``FedProx`` for fedsim's, ``my_module.MyStrategy`` for one's own).
    Without that file (a run from Python) every setting is shown. Either way Hydra's
    ``_target_``/``_partial_`` keys and the :data:`NOT_SHOWN` ones are left out, and only numbers, booleans and
    strings remain (what the dashboard can show)."""
    overrides = _read_yaml(run_dir / ".hydra" / "overrides.yaml") if run_dir is not None else None
    if isinstance(overrides, list):
        set_keys = [_override_key(str(o)) for o in overrides]
        keys = list(dict.fromkeys([*ALWAYS_SHOWN, *set_keys]))
    else:
        set_keys, keys = [], list(dict.fromkeys([*ALWAYS_SHOWN, *sorted(settings)]))
    choices = {k: v for k, v in _group_choices(run_dir).items() if f"{k}._target_" not in set_keys}
    shown: dict[str, Any] = {}
    for key in keys:
        if not key or key.split(".")[0] in NOT_SHOWN or key.rsplit(".", 1)[-1] in ("_target_", "_partial_"):
            continue
        value = settings[key] if key in settings else _group_option(key, settings, choices)
        if isinstance(value, (bool, int, float, str)):
            shown[key] = value
    return shown


def _override_key(override: str) -> str:
    """``client.optimizer.lr`` of ``client.optimizer.lr=0.1`` (also ``+key=...``, ``++key=...``); ``""`` for a
    deletion (``~key``)."""
    if override.startswith("~"):
        return ""
    return override.split("=", 1)[0].lstrip("+").split("@", 1)[0]


def _group_option(group: str, settings: dict[str, Any], choices: dict[str, Any]) -> Any:
    """The option a config group was given (``fedprox``) when its ``_target_`` is fedsim's, else the class that
    ran: the class name of fedsim's own (``FedProx``), the whole ``module.Class`` of any other; ``None`` if
    ``group`` is no group."""
    target = settings.get(f"{group}._target_")
    own = isinstance(target, str) and target.startswith("fedsim.")
    if isinstance(choices.get(group), str) and (own or target is None):
        return choices[group]
    if not isinstance(target, str):
        return None
    return target.rsplit(".", 1)[-1] if own else target


def _group_choices(run_dir: Path | None) -> dict[str, Any]:
    """Hydra's record of the option chosen for each config group (``.hydra/hydra.yaml``), if any."""
    recorded: Any = _read_yaml(run_dir / ".hydra" / "hydra.yaml") if run_dir is not None else None
    try:
        return dict(recorded["hydra"]["runtime"]["choices"])
    except (TypeError, KeyError):
        return {}


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None


def write_hparams(log_dir: Path, hparams: dict[str, Any], results: dict[str, Any]) -> None:
    """Add a run's HParams row to the event files in ``log_dir`` (a second file next to the run's, which is
    closed by now): ``hparams`` and the numbers of ``results`` (``summary.json``) that :data:`HPARAMS_METRICS`
    names as ``summary/<name>``, as scalars at the last round."""
    from torch.utils.tensorboard import SummaryWriter

    step = int(results.get("rounds") or 0)
    summary = {tag: results.get(tag.removeprefix("summary/")) for tag in HPARAMS_METRICS if tag.startswith("summary/")}
    with SummaryWriter(log_dir=str(log_dir)) as writer:
        for tag, value in summary.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                writer.add_scalar(tag, float(value), step)
        for part in hparams_summaries(hparams):
            writer.file_writer.add_summary(part, step)


def hparams_summaries(hparams: dict[str, Any]) -> list[Any]:
    """The three summaries of TensorBoard's HParams plugin (experiment, session start, session end) for one run.

    Built here rather than with ``torch.utils.tensorboard.summary.hparams``, which records ``True`` as ``1.0``.
    An integer (``seed``, ``num_rounds``) is recorded as its digits, a string: the dashboard prints every number
    with five significant digits (``0.0000``) and has no integer type; its filter is then a regex (``^[01]$``).
    The metric columns are :data:`HPARAMS_METRICS`, scalars of the same run."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    start = plugin_data_pb2.SessionStartInfo()
    infos = []
    for key, value in hparams.items():
        if isinstance(value, bool):
            start.hparams[key].bool_value, kind = value, api_pb2.DATA_TYPE_BOOL
        elif isinstance(value, int):  # the dashboard prints every number with 5 digits: seed 0 would read 0.0000
            start.hparams[key].string_value, kind = str(value), api_pb2.DATA_TYPE_STRING
        elif isinstance(value, float):
            start.hparams[key].number_value, kind = float(value), api_pb2.DATA_TYPE_FLOAT64
        else:
            start.hparams[key].string_value, kind = str(value), api_pb2.DATA_TYPE_STRING
        infos.append(api_pb2.HParamInfo(name=key, type=kind))
    metrics = [
        api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag), display_name=title)
        for tag, title in HPARAMS_METRICS.items()
    ]
    parts = [
        (
            metadata.EXPERIMENT_TAG,
            plugin_data_pb2.HParamsPluginData(experiment=api_pb2.Experiment(hparam_infos=infos, metric_infos=metrics)),
        ),
        (metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=start)),
        (
            metadata.SESSION_END_INFO_TAG,
            plugin_data_pb2.HParamsPluginData(
                session_end_info=plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS)
            ),
        ),
    ]
    for _, data in parts:
        data.version = metadata.PLUGIN_DATA_VERSION
    return [
        Summary(
            value=[Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(data), tensor=metadata.NULL_TENSOR)]
        )
        for tag, data in parts
    ]


def label_distribution_image(label_counts: np.ndarray) -> np.ndarray:
    """The partition as an RGB image (height × width × 3, ``uint8``): a heatmap with one column per client and
    one row per class, coloured by the share of the client's examples in that class, with axes, a colour bar
    and a title. Without matplotlib: a grey bitmap (one row per client), and a debug line says why.

    Drawing takes ~0.13 s of CPU; the last few partitions' images are kept, so the jobs of a sweep that run in one
    process (Hydra's basic launcher) on the same partition draw it once."""
    counts = np.ascontiguousarray(label_counts, dtype=np.float64)
    return _drawn(counts.shape, counts.tobytes()).copy()


@functools.lru_cache(maxsize=4)
def _drawn(shape: tuple[int, ...], raw: bytes) -> np.ndarray:
    """:func:`label_distribution_image` of the counts ``raw`` (float64 bytes of an array of ``shape``)."""
    counts = np.frombuffer(raw, dtype=np.float64).reshape(shape)
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        log.debug("matplotlib is not installed: the label distribution is a plain bitmap (pip install matplotlib)")
        grey = np.kron(shares, np.ones((4, 8)))  # each cell 4x8 pixels
        return np.repeat((grey * 255).astype(np.uint8)[..., None], 3, axis=2)
    num_clients, num_classes = shares.shape
    figure = Figure(
        figsize=(5.0, 2.8), dpi=100, layout="constrained"
    )  # 500 x 280 pixels: legible at its size in TensorBoard
    figure.set_facecolor("white")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    cells = axes.imshow(
        shares.T,
        aspect="auto",
        origin="lower",
        cmap="viridis",
        vmin=0.0,
        vmax=max(float(shares.max()), 1e-9),
        interpolation="nearest",
    )
    axes.set_xlabel("client", fontsize=12)
    axes.set_ylabel("class", fontsize=12)
    axes.tick_params(labelsize=10)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_title(f"label distribution: {num_clients} clients, {num_classes} classes", fontsize=12)
    bar = figure.colorbar(cells, ax=axes, fraction=0.05, pad=0.02)
    bar.set_label("share of the client's examples", fontsize=11)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="rgba", dpi=100)
    width, height = (int(v) for v in figure.canvas.get_width_height())
    return np.frombuffer(buffer.getvalue(), dtype=np.uint8).reshape(height, width, 4)[..., :3].copy()
