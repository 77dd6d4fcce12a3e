"""Writing for the handlers: every line is flushed as it is written, so a command's output
and its notes on stderr arrive in the order they were produced, even through pipes."""

from __future__ import annotations

import sys
from pathlib import Path


def out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def err(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def say(text: str) -> None:
    """A progress line or a note of restore, run and bundle (stdout carries their verdict)."""
    err(f"envlock: {text}\n")


def say_link(path: Path) -> None:
    """A lock that is a symbolic link is updated where it points; say so, it may be shared."""
    if path.is_symlink():
        from envlock.lock import write_target

        err(f"note: {path} is a symbolic link; updated its target {write_target(path)}\n")


def deliver(data: str | bytes, path: str | None) -> None:
    """A report written to ``path`` (``-o``), else to stdout; a PNG is not written to a
    terminal, where its bytes would be noise and escape sequences."""
    from envlock.errors import EnvlockError, UsageError

    raw = data.encode("utf-8") if isinstance(data, str) else data
    if path is None:
        if isinstance(data, bytes) and sys.stdout.isatty():
            raise UsageError("a PNG is not written to a terminal", hint="give -o FILE.png")
        sys.stdout.flush()
        sys.stdout.buffer.write(raw)
        sys.stdout.buffer.flush()
        return
    try:
        Path(path).write_bytes(raw)
    except OSError as exc:
        raise EnvlockError(f"cannot write {path}: {exc.strerror or exc}") from None
