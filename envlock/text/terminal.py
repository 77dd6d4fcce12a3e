"""Text a terminal shows literally: the one escaping rule for everything envlock prints, and the
one way a count is written ("1 output", "2 outputs").

A leaf below every package that prints (the reports, the comparator's messages, the commands,
the lock's reader naming a bad value), so each can use it without importing another's module.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

# What a lock may hold but a terminal must never receive raw: C0 controls (ESC starts escape
# sequences that retitle windows, rewrite lines or fake hyperlinks), DEL, C1 controls (CSI and
# OSC have one-byte forms), line and paragraph separators, and the Unicode bidi controls that
# display text in another order than it is stored. JSON output is escaped by json already.
_UNSAFE_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    c = match.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def safe(value: Any) -> str:
    """``value`` as text a terminal shows literally: every control character escaped, a
    newline in a value included (it would otherwise forge a line of output)."""
    text = str(value)
    return _UNSAFE_RE.sub(_escape, text) if _UNSAFE_RE.search(text) else text


def dash(value: Any) -> str:
    """``value`` as a table cell shows it: a dash where there is nothing, so an empty cell is
    not read as a missing column; escaped like every other value."""
    return "-" if value in (None, "", []) else safe(value)


class Tail:
    """The last lines of an output stream fed in chunks as it passes through (a command's
    stderr), kept to report a command that failed: at most ``keep`` bytes are held, so a
    chatty training run costs nothing."""

    def __init__(self, lines: int = 20, keep: int = 64 << 10, width: int = 500) -> None:
        self._lines, self._keep, self._width = lines, keep, width
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data
        if len(self._buf) > 2 * self._keep:
            del self._buf[:-self._keep]

    def lines(self) -> list[str]:
        """The last non-blank lines (a carriage return ends a line, as a progress bar's do),
        each cut at ``width`` characters; raw text, to be escaped where it is shown."""
        text = bytes(self._buf[-self._keep:]).decode("utf-8", "replace")
        rows = [row.rstrip() for row in text.splitlines() if row.strip()]
        return [row if len(row) <= self._width else row[:self._width] + "…"
                for row in rows[-self._lines:]]


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``n`` and ``noun``, in the plural unless ``n`` is 1 ("1 output", "2 outputs", "0 steps");
    ``many`` where adding "s" is not the plural ("shadowed copies")."""
    return f"{n} {noun if n == 1 else many or noun + 's'}"


def first(items: Sequence[str], n: int) -> str:
    """The first ``n`` of ``items``, comma-separated, then how many more ("a, b and 3 more"):
    a message names a few of what may be thousands."""
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def agree(n: int, one: str, many: str) -> str:
    """The verb that agrees with a count of ``n``: ``agree(1, "differs", "differ")``."""
    return one if n == 1 else many
