"""The ``--deep`` progress bar, drawn while the probe hashes in another interpreter.

The probe (``probe/deep.py``) writes one tagged line to stderr per step; the probe runner
(``probing/capture.py``) feeds each stderr line here, and what is not a progress line passes on
as the probe's own output. rich is imported only when a bar is drawn, so a warm check pays nothing.
"""

from __future__ import annotations

import sys
import time
from typing import Any

_PROGRESS_TAG = "\x1eenvlock-progress "


class Progress:
    """Deep-check progress on stderr: only on a terminal, only once a run has lasted a second
    (a warm venv is done before that), with rich imported only then."""

    def __init__(self, delay: float = 1.0) -> None:
        self.enabled = sys.stderr.isatty()
        self.start = time.monotonic()
        self.delay = delay
        self.bar: Any = None
        self.task: Any = None

    def feed(self, line: str) -> bool:
        """Take one stderr line of the probe; True when it was a progress line."""
        if not line.startswith(_PROGRESS_TAG):
            return False
        if not self.enabled or time.monotonic() - self.start < self.delay:
            return True
        try:
            files, total_files, nbytes, total_bytes = (int(x) for x in line[len(_PROGRESS_TAG):].split())
        except ValueError:
            return True
        if self.bar is None:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self.bar = Progress(TextColumn("hashing {task.description}"), BarColumn(),
                                DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                                transient=True)
            self.bar.start()
            # Started a second late: begin at what is done, or the first speed reads TB/s.
            self.task = self.bar.add_task("", total=total_bytes, completed=nbytes)
        self.bar.update(self.task, completed=nbytes, description=f"{files:,}/{total_files:,} files")
        return True

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
