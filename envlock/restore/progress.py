"""Build progress: a live status line on a terminal (rich, imported lazily), plain lines otherwise.

Plain lines are what CI logs and pipes want; the live line keeps a terminal readable while pip
prints hundreds of lines. Set ENVLOCK_PLAIN_PROGRESS=1 to force plain lines on a terminal.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Protocol


class Progress(Protocol):
    def step(self, number: int, total: int, text: str) -> None: ...
    def line(self, text: str) -> None: ...
    def close(self) -> None: ...


class PlainProgress:
    """One line per build output line: for logs and pipes."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr

    def step(self, number: int, total: int, text: str) -> None:
        self.stream.write(f"[{number}/{total}] {text}\n")
        self.stream.flush()

    def line(self, text: str) -> None:
        self.stream.write(f"    {text}\n")
        self.stream.flush()

    def close(self) -> None:
        return None


class RichProgress:
    """A live status line on a terminal: steps stay, the step's output scrolls in one line."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False)
        self.status = self.console.status("starting build")
        self.status.start()
        self.current = ""

    def step(self, number: int, total: int, text: str) -> None:
        from rich.markup import escape

        self.current = f"[{number}/{total}]"
        self.console.print(f"[bold cyan]{self.current}[/] {escape(text[:160])}")
        self.status.update(f"{self.current} {escape(text[:80])}")

    def line(self, text: str) -> None:
        from rich.markup import escape

        self.status.update(f"{self.current} [dim]{escape(text[:100])}[/]")

    def close(self) -> None:
        self.status.stop()


def make_progress(stream: Any = None) -> Progress:
    stream = stream or sys.stderr
    if stream.isatty() and not os.environ.get("ENVLOCK_PLAIN_PROGRESS"):
        return RichProgress()
    return PlainProgress(stream)
