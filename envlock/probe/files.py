"""Reading and writing files the probe's way: bounded reads of regular files only, atomic
writes; and the one sha256 the probe hashes with.

Every file the probe reads comes from the environment it describes, which may hold anything a
user, a broken install or a hostile package put there: a ``RECORD`` that is a link to
``/dev/zero`` (an endless read), a FIFO (a read that never returns), a file of gigabytes. So
a file is opened without blocking (a FIFO opens at once), checked on the open descriptor to be
a regular file (no race between the check and the read), and read up to a cap. Links are
followed, to regular files only: conda's soft-link mode and Nix or Spack views make a
distribution's own files links into a package store outside the environment's prefix, and
what makes a link dangerous is what it points at, which the checks above refuse.

Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from typing import Any, Optional

# The one hash function of the probe (its cache keys, RECORD digests, source digest).
sha256 = hashlib.sha256

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) \
    | getattr(os, "O_CLOEXEC", 0)


class UnsafeFile(OSError):
    """A file the probe will not read: not a regular file, or larger than its cap."""


def open_regular(path: str) -> int:
    """A descriptor of ``path`` opened for reading, only if it is a regular file.

    ``O_NONBLOCK`` makes opening a FIFO return at once (and is a no-op on a regular file);
    the type is checked on the descriptor, so the file read is the file checked.
    """
    fd = os.open(path, _OPEN_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFile("not a regular file (%s)" % _kind(mode))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


def read_regular(path: str, limit: int) -> bytes:
    """The whole of regular file ``path``; ``UnsafeFile`` when it is not one or holds more
    than ``limit`` bytes (a size that lies, as in /proc, is caught by the read itself)."""
    data = read_head(path, limit + 1)
    if len(data) > limit:
        raise UnsafeFile("larger than %d MiB" % (limit >> 20) if limit >= 1 << 20
                         else "larger than %d bytes" % limit)
    return data


def read_head(path: str, limit: int) -> bytes:
    """At most the first ``limit`` bytes of regular file ``path`` (``UnsafeFile`` otherwise)."""
    with os.fdopen(open_regular(path), "rb") as fh:
        data = fh.read(limit)
    if data is None:  # a regular file that answers like a device (/proc/kmsg): nothing yet
        raise UnsafeFile("would block")
    return data


def read_text(path: str, limit: int = 1 << 20) -> Optional[str]:
    """The first ``limit`` bytes of a regular file as text; None when it cannot be read."""
    try:
        return read_head(path, limit).decode("utf-8", "replace")
    except OSError:
        return None


def read_bytes(path: str, limit: int = 4 << 20) -> Optional[bytes]:
    try:
        return read_head(path, limit)
    except OSError:
        return None


def atomic_json(path: str, data: Any) -> bool:
    """Write JSON through a private temp file and a rename: a reader sees the old file or the
    new one, never half of one. Never raises (a cache that cannot be written is no cache)."""
    import tempfile

    directory = os.path.dirname(path)
    tmp = None
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
        with os.fdopen(fd, "wb") as fh:
            fh.write(json.dumps(data, sort_keys=True).encode("utf-8"))
        os.replace(tmp, path)
        tmp = None
        return True
    except OSError:
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
