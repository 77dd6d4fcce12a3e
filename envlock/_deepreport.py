"""``verify --deep`` and the torch-facts cache, on envlock's side of the probe.

The hashing itself is ``envlock/probe/deep.py`` (stdlib, run by the probe in the checked
interpreter); this module turns its report into differences, lines up a ``--deep`` lock with a
plain capture, and draws progress on a terminal.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from envlock._textsafe import agree, plural

if TYPE_CHECKING:
    from envlock._comparison import Comparison, Difference
    from envlock.lock import Lock

DEFAULT_FILES_SHOWN = 10
# Rarer kinds first, so a page of edits does not hide the one missing file.
_KINDS = {"missing": "missing", "added": "added (not in RECORD)", "unreadable": "unreadable",
          "modified": "modified"}
_DEEP_FIELDS = ("files_sha256", "files_changed")
_PROGRESS_TAG = "\x1eenvlock-progress "


def differences(report: dict[str, Any], limit: int | None = DEFAULT_FILES_SHOWN) -> list[Difference]:
    """One breaking difference per file found (``limit`` per distribution, None for all)."""
    from envlock._comparison import Difference

    out: list[Difference] = []
    for name, kinds in sorted(report.get("dists", {}).items()):
        files = [(kind, rel) for kind in _KINDS for rel in kinds.get(kind, [])]
        shown = files if limit is None else files[:limit]
        for kind, rel in shown:
            out.append(Difference("files", f"files.{name}.{rel}", None, kind, "breaking",
                                  f"{name}: {_KINDS[kind]}: {rel}"))
        if len(shown) < len(files):
            rest = len(files) - len(shown)
            out.append(Difference("files", f"files.{name}", None, f"{rest} more", "breaking",
                                  f"{name}: {plural(rest, 'more file')} {agree(rest, 'differs', 'differ')} from RECORD (--all lists them)"))
    return out


def merge(cmp: Comparison, report: dict[str, Any] | None,
          limit: int | None = DEFAULT_FILES_SHOWN) -> Comparison:
    """``cmp`` plus the deep findings, most severe first as ``compare`` orders them."""
    from envlock._comparison import SEVERITY_RANK, Comparison

    if not report:
        return cmp
    items = [*cmp.differences, *differences(report, limit)]
    return Comparison(tuple(sorted(items, key=lambda d: SEVERITY_RANK[d.severity])), cmp.process,
                      strict=cmp.strict)


def align(expected: Lock, current: Lock) -> tuple[Lock, Lock]:
    """Drop the per-file fields from whichever side lacks them.

    A ``--deep`` lock verified without ``--deep`` (or the reverse) has nothing to compare
    file-wise, which is not drift; when both sides have them, ``compare`` sees them as any
    other package field.
    """
    def deep(lock: Lock) -> bool:
        return any(p.files_sha256 is not None for p in lock.packages)

    def strip(lock: Lock) -> Lock:
        bare = {f: None for f in _DEEP_FIELDS}
        return lock.model_copy(update={"packages": [p.model_copy(update=bare) for p in lock.packages]})

    if deep(expected) and not deep(current):
        return strip(expected), current
    if deep(current) and not deep(expected):
        return expected, strip(current)
    return expected, current


def summary(report: dict[str, Any] | None) -> str:
    """One line: what was checked, and how much of it was read again or taken on its stat."""
    if not report:
        return ""
    secs = max(report.get("seconds", 0.0), 1e-6)
    files = report.get("files", 0)
    gb = report.get("bytes", 0) / 1e9
    cached = report.get("cached_files", 0)
    bad = len(report.get("dists", {}))
    if cached:
        # Said in full: a user who suspects more than an edit needs to know what was trusted.
        head = (f"deep: {plural(files, 'file')} ({gb:.2f} GB) in {secs:.2f}s; "
                f"{report.get('hashed_files', files - cached)} re-hashed, {cached} unchanged "
                f"since the last check by size/mtime/ctime (--no-cache re-hashes all); ")
    else:
        head = (f"deep: {plural(files, 'file')}, {gb:.2f} GB hashed in {secs:.2f}s "
                f"({gb / secs:.2f} GB/s, {plural(report.get('workers', 1), 'worker')}); ")
    return head + (f"{plural(bad, 'distribution')} {agree(bad, 'differs', 'differ')} from RECORD" if bad
                   else "every file matches RECORD") + "\n"


def torch_facts_line(lock: Lock) -> str:
    facts = lock.probe.torch_facts
    if facts == "cached":
        return "torch facts: cached (nothing torch depends on changed; --no-cache re-imports)\n"
    if facts == "live":
        return "torch facts: live (torch imported)\n"
    return ""


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
