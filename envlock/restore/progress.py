"""Build progress: a live status line on a terminal (rich, imported lazily), plain lines otherwise.

Plain lines are what CI logs and pipes want: one per step, envlock's progress, while the builder's
own output (pip prints hundreds of lines, most of them warnings that mean nothing to the user)
goes to the build's log file alone, which the summary line names and a failed build shows the
last lines of. The live line keeps a terminal readable the same way. Set ENVLOCK_PLAIN_PROGRESS=1
to force plain lines on a terminal.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from envlock.restore.buildlog import Event, Step
from envlock.text.terminal import plural


class Progress(Protocol):
    def step(self, number: int, total: int, text: str) -> None: ...
    def line(self, text: str) -> None: ...
    def close(self) -> None: ...


class _Counted:
    """What every progress ends with: one summary line of the build (steps, lines of output)."""

    def __init__(self, stream: Any = None, log: Path | None = None) -> None:
        self.stream = stream or sys.stderr
        self.log = log
        self.steps = self.total = self.lines = 0

    def count_step(self, number: int, total: int) -> None:
        self.steps, self.total = max(self.steps, number), max(self.total, total)

    def summary(self) -> str:
        steps = f"{self.steps}/{plural(self.total, 'step')}" if self.total else "no steps"
        return f"envlock: build: {steps}, {plural(self.lines, 'line')} of output (all in {self.log or 'build.log'})\n"


class PlainProgress(_Counted):
    """One line per build step: for logs and pipes. The builder's output lines are counted,
    not shown: they are in the log file (``restore`` writes it), and a failure shows its tail."""

    def step(self, number: int, total: int, text: str) -> None:
        self.count_step(number, total)
        self.stream.write(f"[{number}/{total}] {text}\n")
        self.stream.flush()

    def line(self, text: str) -> None:
        self.lines += 1

    def close(self) -> None:
        self.stream.write(self.summary())
        self.stream.flush()


class QuietProgress(_Counted):
    """``--quiet``: nothing while it builds, the summary line at the end (a failed build still
    shows the log's last lines, and build.log keeps all of it)."""

    def step(self, number: int, total: int, text: str) -> None:
        self.count_step(number, total)

    def line(self, text: str) -> None:
        self.lines += 1

    def close(self) -> None:
        self.stream.write(self.summary())
        self.stream.flush()


class RichProgress(_Counted):
    """A live status line on a terminal: steps stay, the step's output scrolls in one line."""

    def __init__(self, log: Path | None = None) -> None:
        super().__init__(log=log)
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False)
        self.status = self.console.status("starting build")
        self.status.start()
        self.current = ""

    def step(self, number: int, total: int, text: str) -> None:
        from rich.markup import escape

        self.count_step(number, total)
        self.current = f"[{number}/{total}]"
        self.console.print(f"[bold cyan]{self.current}[/] {escape(text[:160])}")
        self.status.update(f"{self.current} {escape(text[:80])}")

    def line(self, text: str) -> None:
        from rich.markup import escape

        self.lines += 1
        self.status.update(f"{self.current} [dim]{escape(text[:100])}[/]")

    def close(self) -> None:
        self.status.stop()
        self.stream.write(self.summary())
        self.stream.flush()


def show(progress: Progress, events: Iterable[Event]) -> None:
    """What a build chunk said (``buildlog.BuildLog.feed``), on the progress display."""
    for event in events:
        if isinstance(event, Step):
            progress.step(event.number, event.total, event.text)
        else:
            progress.line(event)


def make_progress(stream: Any = None, *, quiet: bool = False, log: Path | None = None) -> Progress:
    """The display for a build whose output is kept in ``log`` (named by the summary line)."""
    stream = stream or sys.stderr
    if quiet:
        return QuietProgress(stream, log)
    if stream.isatty() and not os.environ.get("ENVLOCK_PLAIN_PROGRESS"):
        return RichProgress(log)
    return PlainProgress(stream, log)
