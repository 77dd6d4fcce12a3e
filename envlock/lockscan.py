"""Looks at a lock file that cost nothing to import: its size limit and its table names.

``envlock verify`` decides how to start the probe (import torch or not, run the canary or not)
from the lock's table names, before anything heavy is imported (``early``); reading and checking
the lock itself (``envlock.lock``) then overlaps the probe's run.
"""

from __future__ import annotations

import os

# A lock is at most this big: far above any real one, and small enough that a wrong file (a
# dataset, a checkpoint) is refused before it is read into memory.
MAX_LOCK_BYTES = 16 * 1024 * 1024
_NAME = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def table_names(data: bytes) -> set[str]:
    r"""Names of the table headers (``[name`` or ``[[name``, after blanks) that start a line.

    The regular expression ``^[ \t]*\[{1,2}[ \t]*([A-Za-z0-9_-]+)`` (multi-line), spelled
    out with bytes methods: ``re`` costs milliseconds to import, before the probe starts.
    """
    names = set()
    for line in data.split(b"\n"):
        rest = line.lstrip(b" \t")
        if not rest.startswith(b"["):
            continue
        rest = rest[2:] if rest.startswith(b"[[") else rest[1:]
        rest = rest.lstrip(b" \t")
        end = 0
        while end < len(rest) and rest[end] in _NAME:
            end += 1
        if end:
            names.add(rest[:end].decode("ascii"))
    return names


def lock_tables(path: str | os.PathLike[str]) -> set[str] | None:
    """The lock's top-level table names, to decide how to probe before it is read.

    A scan for table headers, not a parse: reading the lock is what the probe overlaps with (a
    header inside a multi-line string can only make the probe do more than needed, never less
    than the lock says). None when the file is not there to scan; reading it reports why.
    """
    try:
        if os.path.getsize(path) > MAX_LOCK_BYTES:
            return None
        with open(path, "rb") as fh:
            return table_names(fh.read())
    except OSError:
        return None
