"""Progress of the long stages (scanning files, verifying candidates, benchmark rounds), for a person
watching a terminal: a live display through rich on a TTY, plain lines otherwise (CI logs).

The stages only call ``stage(name, total)`` and ``step(detail)``; the time left is estimated here
from the steps done so far (each verification check and each benchmark round takes about as long
as the one before), so a stage needs to know nothing about displays. A stage whose end is not a
count (benchmark rounds past the fewest run until the interval is narrow or a time budget ends)
passes ``step(detail, total=None, left_s=...)``: no total, and the time left it knows.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

KEEP = object()  # step(total=KEEP): the stage's total stays as it was


class Progress:
    """Does nothing: the default for library callers."""

    def stage(self, name: str, total: int | None = None) -> None:
        pass

    def step(self, detail: str = "", *, total=KEEP, left_s: float | None = None) -> None:
        """One step done. ``total``: the stage's new total (None: open-ended); ``left_s``: the time
        left as the stage knows it, instead of the estimate from the steps so far."""

    def at(self, done: int, total: int, detail: str = "") -> None:
        """Where a stage with many quick steps is (files scanned): shown live only, never as lines."""

    def close(self) -> None:
        pass


def _eta(started: float, done: int, total: int | None) -> float | None:
    if not total or done <= 0 or done >= total:
        return None
    return (time.monotonic() - started) / done * (total - done)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


class LineProgress(Progress):
    """One line per step: ``verify 2/5: gelu-tanh (about 1 min 10 s left)``."""

    def __init__(self, out: TextIO | None = None):
        self.out = out or sys.stderr
        self.name, self.total, self.done, self.started = "", None, 0, time.monotonic()

    def stage(self, name: str, total: int | None = None) -> None:
        self.name, self.total, self.done, self.started = name, total, 0, time.monotonic()

    def step(self, detail: str = "", *, total=KEEP, left_s: float | None = None) -> None:
        self.done += 1
        if total is not KEEP:
            self.total = total
        count = f"{self.done}/{self.total}" if self.total else str(self.done)
        eta = left_s if left_s is not None else _eta(self.started, self.done, self.total)
        left = f" (about {_duration(eta)} left)" if eta is not None else ""
        print(f"{self.name} {count}{': ' + detail if detail else ''}{left}", file=self.out, flush=True)


class RichProgress(Progress):
    """A live bar per stage, with the stage, the current item, the count and the time left."""

    def __init__(self, console=None):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
        from rich.progress import Progress as Bar

        self.bar = Bar(TextColumn("{task.fields[stage]:<8}"), BarColumn(), MofNCompleteColumn(),
                       TimeRemainingColumn(), TextColumn("{task.description}"),
                       console=console or Console(stderr=True), transient=False)
        self.bar.start()
        self.task = None

    def stage(self, name: str, total: int | None = None) -> None:
        self.task = self.bar.add_task("", total=total, stage=name)

    def step(self, detail: str = "", *, total=KEEP, left_s: float | None = None) -> None:
        if self.task is not None:  # rich estimates the time left from the bar's own pace
            extra = {} if total is KEEP else {"total": total}
            self.bar.update(self.task, advance=1, description=detail[-50:], **extra)

    def at(self, done: int, total: int, detail: str = "") -> None:
        if self.task is not None:
            self.bar.update(self.task, completed=done, total=total, description=detail[-50:])

    def close(self) -> None:
        self.bar.stop()


def for_terminal(stream: TextIO | None = None) -> Progress:
    """Rich on a TTY, plain lines otherwise."""
    stream = stream or sys.stderr
    return RichProgress() if stream.isatty() else LineProgress(stream)
