"""Progress of the slow steps outside the rounds: generating data, partitioning, starting workers, scoring every
client. A step that runs longer than :data:`Settings.after` seconds shows how far it is:

* on a terminal (standard error is a TTY), a tqdm bar on standard error with the count, the rate and the time
  left, which disappears when the step is done;
* anywhere else (a log file, a batch job's output), a line on the ``fedsim.progress`` logger every
  :data:`LINE_EVERY_S` seconds (``data: 310,000/1,000,000 devices (31%), 52,000 devices/s, about 13 s left``) and one
  when it is done: the command line writes them to ``run.log`` only, not to the console
  (:mod:`fedsim.cli.library_output`);
* nothing with ``logger.progress=false`` (``logger=quiet``).

It never reaches ``metrics.jsonl`` or TensorBoard. The command line sets the mode from ``logger.progress`` and
``logger.progress_after`` (:func:`configure`); from Python it is the terminal's bar or the log's lines, after 3 s.
A step with one long call (building a model) still shows its time: a daemon thread refreshes the bar, or writes
the line, every second while the step waits.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tqdm import tqdm

log = logging.getLogger("fedsim.progress")

LINE_EVERY_S = 10.0
"""Seconds between two progress lines of a step in a log."""


@dataclass
class Settings:
    """``enabled``: None shows a bar on a terminal and lines elsewhere, True a bar always, False nothing; a step
    shows its progress once it has run ``after`` seconds."""

    enabled: bool | None = None
    after: float = 3.0


SETTINGS = Settings()


def configure(enabled: bool | None, after: float = 3.0) -> None:
    """Set the mode of every step's progress from here on (the command line: ``logger.progress`` and
    ``logger.progress_after``)."""
    if enabled not in (None, True, False):
        raise ValueError(f"logger.progress must be true, false or null (got {enabled!r})")
    if not (isinstance(after, (int, float)) and not isinstance(after, bool) and after >= 0):
        raise ValueError(f"logger.progress_after must be a number of seconds >= 0 (got {after!r})")
    SETTINGS.enabled, SETTINGS.after = enabled, float(after)


class _Step:
    """One step's progress: a bar, or lines on the log (see the module's docstring)."""

    def __init__(self, what: str, total: int | None, unit: str, bar: bool) -> None:
        self.what, self.total, self.unit, self.done = what, total, unit, 0
        self.began = self.said = time.monotonic()
        self.lines, self.closed = 0, False
        self.lock = threading.Lock()
        scale = total is not None and total >= 100_000  # 1.2M draws; 12/20 devices as they are
        shape = "{desc}: {elapsed}" if total is None else None  # one long call: its time
        self.bar = (
            tqdm(
                total=total,
                desc=what,
                unit=unit,
                unit_scale=scale,
                bar_format=shape,
                leave=False,
                delay=SETTINGS.after,
                file=sys.stderr,
            )
            if bar
            else None
        )

    def advance(self, count: int = 1) -> None:
        """``count`` more units done."""
        with self.lock:
            self.done += count
            if self.bar is not None:
                self.bar.update(count)  # redrawn at most every 0.1 s
                return
        self.tick()

    def tick(self) -> None:
        """Refresh the bar (its clock, while one long call runs), or write a line when one is due."""
        now = time.monotonic()
        with self.lock:
            if self.closed or now - self.began < SETTINGS.after:
                return
            if self.bar is not None:
                self.bar.refresh()
                self.bar.last_print_t = self.bar._time()  # shown: close() clears it (tqdm counts update()'s only)
            elif self.lines == 0 or now - self.said >= LINE_EVERY_S:
                self.said, self.lines = now, self.lines + 1
                log.info("%s: %s", self.what, self._state(now))

    def _state(self, now: float) -> str:
        elapsed = now - self.began
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if self.total is None:
            return f"{elapsed:.0f} s" + (f", {self.done:,} {self.unit}s" if self.done else "")
        left = f", about {(self.total - self.done) / rate:.0f} s left" if rate > 0 else ""
        share = self.done / self.total if self.total else 1.0
        return f"{self.done:,}/{self.total:,} {self.unit}s ({share:.0%}), {rate:,.0f} {self.unit}s/s{left}"

    def close(self) -> None:
        """The bar goes; a step that wrote lines says it is done."""
        with self.lock:
            self.closed = True
        if self.bar is not None:
            self.bar.close()
        elif self.lines:
            count = f"{self.done:,} {self.unit}s " if self.done else ""
            log.info("%s: done, %sin %.1f s", self.what, count, time.monotonic() - self.began)


@contextlib.contextmanager
def progress(what: str, total: int | None, unit: str) -> Iterator[Callable[[int], None]]:
    """Inside: the step ``what``, of ``total`` units named ``unit``, shows its progress (see the module's docstring);
    call the yielded function with the number of units just done. ``total=None``: one long call, or an unknown
    count; its time is shown."""
    mode = SETTINGS.enabled
    if mode is False:
        yield _ignore
        return
    step = _Step(what, total, unit, bar=mode is True or sys.stderr.isatty())
    if SETTINGS.after == 0:
        step.tick()  # every step shows, from its start
    with _TICKING.lock:
        _TICKING.steps.append(step)
        _TICKING.start()
    try:
        yield step.advance
    finally:
        with _TICKING.lock:
            _TICKING.steps.remove(step)
        step.close()


def _ignore(count: int = 1) -> None:
    """What a step counts with when progress is off."""


@dataclass
class _Ticking:
    """The steps in progress, and the one daemon thread that ticks them every second (started on first use, so a
    step costs no thread of its own)."""

    steps: list[_Step] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread unless it runs (a forked child has none)."""
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._tick, name="fedsim-progress", daemon=True)
            self.thread.start()

    def _tick(self) -> None:
        while True:
            time.sleep(1.0)
            with self.lock:
                steps = list(self.steps)
            for step in steps:
                step.tick()


_TICKING = _Ticking()
