"""Labels and plots of :mod:`fedsim.report`: one PNG per plotted scalar, a curve per configuration.

A configuration is named by the overrides that differ between configurations; the overrides they all share
go in a wrapped footnote under the plot. The legend sits right of the axes (the saved image grows to hold
it), so it never covers a curve. matplotlib is imported only when drawing (``pip install fedsim-torch[plot]``).
"""

from __future__ import annotations

import bisect
import math
import re
import statistics
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedsim.report.runs import COMM_MB, CUMULATIVE, EPSILON, SIM_TIME, Run, along, logged_name

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Config = tuple[str, ...]
ACCURACY = "eval/accuracy"
X_AXES = {
    "round": "round",
    "wall_time": "wall time, s (mean over seeds)",  # --x choices and their axis labels
    "sim_time": f"simulated time, s ({SIM_TIME})",
    "comm_mb": f"communication, MB both ways ({COMM_MB})",
    "epsilon": f"privacy budget spent, ε ({EPSILON})",
}
ROUND_TIME = "time/round_s"  # summed into the wall_time axis
MAX_VALUE = 24  # legend values longer than this are cut in the middle
LEGEND_CHARS = 40  # longer legend names wrap onto more lines (between overrides)
LEGEND_ROWS = 16  # legend entries per column
FOOTNOTE_CHARS = 80  # the footnote's wrap width: no wider than the axes in small type (clear of the legend)
STYLES = ("-", "--", ":", "-.")  # after the 10 colours, the next 10 configurations get the next line style


def split_common(configs: Sequence[Config]) -> tuple[dict[Config, Config], list[str]]:
    """Each configuration's overrides that not every configuration shares, and the shared ones (none for a
    single configuration: its own overrides are what names it)."""
    common = sorted(set.intersection(*(set(c) for c in configs))) if len(configs) > 1 else []
    return {c: tuple(o for o in c if o not in common) for c in configs}, common


def labels(configs: Sequence[Config]) -> tuple[dict[Config, str], list[str]]:
    """Table names (the differing overrides, comma-joined as on a command line) and the shared overrides."""
    differing, common = split_common(configs)
    return {c: ",".join(d) or ("(common only)" if c else "(defaults)") for c, d in differing.items()}, common


def short_keys(keys: Sequence[str]) -> dict[str, str]:
    """Each dotted key's shortest trailing part that no other key ends with (``client.optimizer.lr`` → ``lr``
    unless another key ends in ``.lr`` too); Hydra's ``+``/``~`` prefixes are dropped."""
    parts = {key: key.lstrip("+~").split(".") for key in keys}
    short = {}
    for key, mine in parts.items():
        for n in range(1, len(mine) + 1):
            tail = mine[-n:]
            if not any(other[-n:] == tail for k, other in parts.items() if k != key):
                break
        short[key] = ".".join(tail)
    return short


def _cut(value: str, limit: int = MAX_VALUE) -> str:
    """``value``, or its start and end around an ellipsis when longer than ``limit``."""
    if len(value) <= limit:
        return value
    head = (limit - 1) // 2
    return f"{value[:head]}…{value[len(value) - (limit - 1 - head) :]}"


def legend_labels(configs: Sequence[Config]) -> dict[Config, str]:
    """Short, distinct legend names: the differing overrides with shortened keys and long values cut; where
    that makes two names equal, the table's names (with a ``#n`` suffix if even those collide). A single
    configuration is ``all runs`` (its overrides are the plot's footnote)."""
    differing, _ = split_common(configs)
    keys = sorted({o.partition("=")[0] for d in differing.values() for o in d})
    short = short_keys(keys)

    def name(overrides: Config) -> str:
        pairs = (o.partition("=") for o in overrides)
        return ", ".join(f"{short[k]}={_cut(v)}" if sep else _cut(k) for k, sep, v in pairs)

    if len(configs) == 1:  # its overrides go in the footnote
        return {configs[0]: "all runs"}
    names = {c: name(d) or ("(common only)" if c else "(defaults)") for c, d in differing.items()}
    if len(set(names.values())) < len(names):
        names = labels(configs)[0]
    seen: dict[str, int] = {}
    for config, text in names.items():
        seen[text] = seen.get(text, 0) + 1
        names[config] = text if seen[text] == 1 else f"{text} #{seen[text]}"
    return names


def elapsed(run: Run) -> dict[int, float]:
    """Seconds since the run started at the end of each round: the running sum of ``time/round_s``."""
    total, out = 0.0, {}
    for round_num, seconds in run.series.get(ROUND_TIME, ()):
        total += seconds if math.isfinite(seconds) else 0.0
        out[round_num] = total
    return out


def points(run: Run, metric: str = ACCURACY, x: str = "round") -> list[tuple[int, float, float]]:
    """``(round, x, value)`` of the rounds where ``run`` logged a finite ``metric`` (and, for the
    ``wall_time`` axis, a round time; for ``sim_time``, a simulated time; for ``comm_mb``, the megabytes sent).
    ``metric`` may be a fallback list ``A,B``: the first of them the run logged
    (:func:`~fedsim.report.runs.logged_name`)."""
    name = logged_name(run, metric) or metric  # of a fallback list A,B, the first the run logged
    values = run.curve if name == ACCURACY else run.series.get(name, ())
    when = elapsed(run) if x == "wall_time" else dict(along(run, x)) if x in CUMULATIVE else None
    return [
        (n, float(n) if when is None else when[n], v)
        for n, v in values
        if math.isfinite(v) and (when is None or n in when)
    ]


def mean_curve(
    runs: Sequence[Run], metric: str = ACCURACY, x: str = "round"
) -> list[tuple[float, float, float, float]]:
    """``(x, mean, min, max)`` of ``metric`` per round over the seeds that logged it that round; ``x`` is the
    round, or with ``x="wall_time"`` the mean over those seeds of the seconds elapsed by then. With
    ``x="sim_time"`` or ``x="comm_mb"`` the seeds' running totals may differ (clock drops, failed uploads), so
    the curve is :func:`latest_mean` instead."""
    if x in CUMULATIVE:
        return latest_mean(runs, metric, x)
    by_round: dict[int, list[tuple[float, float]]] = {}
    for run in runs:
        for round_num, at, value in points(run, metric, x):
            by_round.setdefault(round_num, []).append((at, value))
    curve = []
    for _, pairs in sorted(by_round.items()):
        xs, values = zip(*pairs, strict=True)
        curve.append((statistics.fmean(xs), statistics.fmean(values), min(values), max(values)))
    return curve


def latest_mean(
    runs: Sequence[Run], metric: str = ACCURACY, x: str = "sim_time"
) -> list[tuple[float, float, float, float]]:
    """``(t, mean, min, max)`` against a running total (``x``: ``sim_time``, the simulated time ``sim/time_s``, or
    ``comm_mb``, the megabytes sent ``comm/mb_total``): at every total at which some seed logged a finite
    ``metric`` (the union of the seeds' totals, ascending), each seed's latest value by then (a step function:
    the value of its last round ending at or before ``t``), averaged over the seeds that had logged one. A seed
    counts from its first value on and keeps its last value after its last round; runs without the total are
    left out. E.g. seeds with ``(10 s, 0.2), (20 s, 0.5)`` and ``(15 s, 0.4)`` give ``(10, 0.2, 0.2, 0.2)``,
    ``(15, 0.3, 0.2, 0.4)``, ``(20, 0.45, 0.4, 0.5)``."""
    tracks = [sorted(((at, v) for _, at, v in points(run, metric, x)), key=lambda p: p[0]) for run in runs]
    tracks = [track for track in tracks if track]
    times = [[at for at, _ in track] for track in tracks]
    curve = []
    for t in sorted({at for track in times for at in track}):
        latest = [
            track[i - 1][1] for track, at in zip(tracks, times, strict=True) if (i := bisect.bisect_right(at, t)) > 0
        ]
        curve.append((t, statistics.fmean(latest), min(latest), max(latest)))
    return curve


def png_name(metric: str) -> str:
    """``accuracy.png`` for test accuracy, else the scalar's name made a file name (``eval/loss`` →
    ``eval_loss.png``)."""
    return "accuracy.png" if metric == ACCURACY else re.sub(r"[^A-Za-z0-9_.-]", "_", metric) + ".png"


def _shown(metric: str) -> str:
    """The axis label of ``metric``; a fallback list ``A,B`` reads ``A or B`` (each curve's legend entry says which)."""
    return metric.replace(",", " or ")


def _used(runs: Sequence[Run], metric: str) -> str:
    """For a fallback list ``A,B``: ``"; B"``, the scalar(s) the configuration's runs logged first; else ``""``."""
    if "," not in metric:
        return ""
    return "; " + ", ".join(dict.fromkeys(n for n in (logged_name(r, metric) for r in runs) if n is not None))


def _seeds(runs: Sequence[Run]) -> str:
    failed = sum(r.failed for r in runs)
    return f"{len(runs)} seed{'s' if len(runs) != 1 else ''}" + (f", {failed} failed" if failed else "")


def draw(
    groups: Mapping[Config, Sequence[Run]],
    metric: str = ACCURACY,
    x: str = "round",
    target: float | None = None,
    facet: str | None = None,
) -> Figure | None:
    """The figure of ``metric`` against ``x``: per configuration the mean over seeds as a line and the min–max
    as a band; ``None`` when no run logged ``metric``. With ``facet`` (an override key), one panel per value
    of it instead (:func:`draw_facets`). Needs matplotlib."""
    if facet is not None:
        return draw_facets(groups, facet, metric, x, target)
    from matplotlib.figure import Figure  # no pyplot: leaves the caller's backend alone
    from matplotlib.ticker import MaxNLocator

    curves = {config: mean_curve(runs, metric, x) for config, runs in groups.items()}
    if not any(curves.values()):
        return None
    names, (heading, note) = legend_labels(list(groups)), _note(list(groups))
    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots()
    for i, (config, curve) in enumerate(curves.items()):
        if not curve:
            continue
        at, mean, low, high = zip(*curve, strict=True)
        (line,) = ax.plot(
            at,
            mean,
            color=f"C{i % 10}",
            linestyle=STYLES[i // 10 % len(STYLES)],
            marker="." if len(at) == 1 else None,
            label=_wrap(f"{names[config]} ({_seeds(groups[config])}{_used(groups[config], metric)})"),
        )
        ax.fill_between(at, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
    if target is not None and metric == ACCURACY:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    if x == "round":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel=X_AXES[x], ylabel=_shown(metric))
    over = "mean over seeds of the latest value" if x in CUMULATIVE else "mean over seeds"
    ax.set_title(f"{_shown(metric)}: {over}, band min–max", fontsize="medium")
    entries = len(ax.get_legend_handles_labels()[1])
    ax.legend(
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
        fontsize="small",
        ncol=math.ceil(entries / LEGEND_ROWS),
    )
    if note:
        ax.annotate(
            footnote(note, heading),
            xy=(0, 0),
            xycoords=("axes fraction", ax.xaxis.label),
            xytext=(0, -6),
            textcoords="offset points",
            ha="left",
            va="top",
            fontsize="small",
            color="dimgrey",
        )
    return fig


DEFAULT = "(default)"  # the facet value of a configuration that did not give the key
PANEL_COLUMNS = 3  # facet panels per row
PANEL_SIZE = (4.2, 3.2)  # inches per panel


def facet_key(override: str) -> str:
    """An override's key as ``--facet`` names it: without Hydra's ``+``, ``++`` or ``~`` prefix."""
    return override.partition("=")[0].lstrip("+~")


def facet_value(config: Config, key: str) -> str:
    """The configuration's value of the override ``key``; :data:`DEFAULT` when it does not give it."""
    return next((o.partition("=")[2] for o in config if facet_key(o) == key), DEFAULT)


def remaining(config: Config, key: str) -> Config:
    """The configuration's overrides without ``key``: what tells its curves apart within a panel."""
    return tuple(o for o in config if facet_key(o) != key)


def panels(configs: Sequence[Config], key: str) -> dict[str, list[Config]]:
    """The configurations by their value of ``key``, values in the order they first occur."""
    out: dict[str, list[Config]] = {}
    for config in configs:
        out.setdefault(facet_value(config, key), []).append(config)
    return out


def draw_facets(
    groups: Mapping[Config, Sequence[Run]],
    key: str,
    metric: str = ACCURACY,
    x: str = "round",
    target: float | None = None,
) -> Figure | None:
    """One panel per value of the override ``key`` (titled ``key=value``, at most 3 per row, shared axes), a curve
    per configuration in its panel as in :func:`draw`. One legend for all panels, right of them: each entry names
    only the remaining settings (the overrides that differ, ``key`` aside) and has the same colour and line style
    in every panel, so a setting is followed across panels by its colour; the overrides all configurations share
    are the footnote. ``None`` when no run logged ``metric``."""
    from matplotlib.figure import Figure  # no pyplot: leaves the caller's backend alone
    from matplotlib.ticker import MaxNLocator

    curves = {config: mean_curve(runs, metric, x) for config, runs in groups.items()}
    if not any(curves.values()):
        return None
    by_value = panels(list(groups), key)
    rests = list(dict.fromkeys(remaining(c, key) for c in groups))
    names = legend_labels(rests) if len(rests) > 1 else {rests[0]: "all runs"}
    cols = min(PANEL_COLUMNS, len(by_value))
    rows = math.ceil(len(by_value) / cols)
    fig = Figure(figsize=(PANEL_SIZE[0] * cols + 2.6, PANEL_SIZE[1] * rows + 0.9), layout="constrained")
    grid = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)
    handles: dict[str, Any] = {}
    for ax, (value, configs) in zip(grid.flat, by_value.items(), strict=False):
        for config in configs:
            if curves[config]:
                i = rests.index(remaining(config, key))
                handles[names[rests[i]]] = _curve(ax, curves[config], i)
        ax.set_title(f"{key}={value} ({_seeds_of(groups, configs)})", fontsize="medium")
        if target is not None and metric == ACCURACY:
            handles[f"target {target}"] = ax.axhline(target, color="grey", linestyle="--", linewidth=1)
        if x == "round":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    for ax in grid.flat[len(by_value) :]:
        fig.delaxes(ax)
    for ax in grid[-1]:
        ax.set_xlabel(X_AXES[x])
    for ax in grid[:, 0]:
        ax.set_ylabel(_shown(metric))
    over = "mean over seeds of the latest value" if x in CUMULATIVE else "mean over seeds"
    fig.suptitle(f"{_shown(metric)} by {key}: {over}, band min–max", fontsize="medium")
    ordered = [n for n in [*(names[r] for r in rests), f"target {target}"] if n in handles]
    fig.legend(
        [handles[n] for n in ordered],
        [_wrap(n) for n in ordered],
        loc="outside right upper",
        fontsize="small",
        title=f"{len(rests)} settings (same in every panel)" if len(rests) > 1 else None,
        title_fontsize="small",
        ncol=math.ceil(len(ordered) / LEGEND_ROWS),
    )
    heading, note = _note(list(groups))
    if note:
        width = int(FOOTNOTE_CHARS * fig.get_figwidth() / 7)
        fig.supxlabel(footnote(note, heading, width), fontsize="small", color="dimgrey", ha="left", x=0.01)
    return fig


def _curve(ax: Any, curve: Sequence[tuple[float, float, float, float]], i: int) -> Any:
    """The mean line (colour and style of the ``i``-th remaining setting) and its min–max band; the line."""
    at, mean, low, high = zip(*curve, strict=True)
    (line,) = ax.plot(
        at, mean, color=f"C{i % 10}", linestyle=STYLES[i // 10 % len(STYLES)], marker="." if len(at) == 1 else None
    )
    ax.fill_between(at, low, high, color=line.get_color(), alpha=0.1, linewidth=0)
    return line


def _seeds_of(groups: Mapping[Config, Sequence[Run]], configs: Sequence[Config]) -> str:
    """``3 seeds each`` (``2–3 seeds each`` when they differ) for a panel's configurations."""
    counts = sorted(len(groups[c]) for c in configs)
    many = f"{counts[0]}" if counts[0] == counts[-1] else f"{counts[0]}–{counts[-1]}"
    return f"{many} seed{'' if many == '1' else 's'}{' each' if len(configs) > 1 else ''}"


def _note(configs: Sequence[Config]) -> tuple[str, list[str]]:
    """The footnote's heading and overrides: those all configurations share, or a single one's own."""
    if len(configs) == 1:
        return "overrides", list(configs[0])
    return "common overrides", split_common(configs)[1]


def footnote(overrides: Sequence[str], heading: str = "common overrides", width: int = FOOTNOTE_CHARS) -> str:
    """``<heading>: a=1 b=2 ...`` wrapped to ``width`` characters (an override is broken only if longer)."""
    return textwrap.fill(f"{heading}: " + " ".join(overrides), width=width, break_on_hyphens=False)


def _wrap(name: str, width: int = LEGEND_CHARS) -> str:
    """A legend name on lines of about ``width`` characters, broken after the commas between overrides."""
    return "\n".join(textwrap.wrap(name, width=width, break_on_hyphens=False)) if len(name) > width else name


def plot_metric(
    groups: Mapping[Config, Sequence[Run]],
    path: Path,
    metric: str = ACCURACY,
    x: str = "round",
    target: float | None = None,
    facet: str | None = None,
) -> bool:
    """Write the :func:`draw` figure to ``path`` (sized to hold the legend and footnote; one panel per value of
    the override ``facet`` if given); ``False`` when no run logged ``metric``. Needs matplotlib."""
    fig = draw(groups, metric, x, target, facet)
    if fig is None:
        return False
    fig.savefig(path, dpi=100, bbox_inches="tight", pad_inches=0.1)
    return True


def have_matplotlib() -> bool:
    """Whether the plots can be drawn."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return False
    return Figure is not None
