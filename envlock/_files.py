"""Files envlock reads whole: the one capped, typed read of a text file, and the one file digest.

A file a command reads as text (a lock, a replay record, a uv configuration file) can be
anything a path names: a FIFO (a read that never returns), ``/dev/zero`` (one that never ends),
a directory, a binary file, gigabytes. It is opened the probe's way (``probe.files``: without
blocking, its type checked on the descriptor, so the file read is the file checked), refused by
its size before a byte is read, read up to the cap, and every way it can fail is one line of the
caller's exception type naming the file (a lock's and a record's ``LockInvalid``, a
configuration file's ``UsageError``: each with the exit code its command documents).

The probe keeps its own readers: it runs standalone, stdlib-only, in interpreters that have no
envlock; this module builds on its ``open_regular`` rather than writing the rule again.
"""

from __future__ import annotations

import hashlib
import os
from typing import NamedTuple

from envlock.errors import EnvlockError
from envlock.probe.files import UnsafeFile, open_regular

_CHUNK = 1 << 20
# A NUL this early is a binary file (an archive, an image) given by mistake, not text.
_BINARY_PROBE = 8192


def _mib(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"


def read_text(path: str | os.PathLike[str], *, limit: int, what: str, error: type[EnvlockError],
              missing_hint: str | None = None) -> str:
    """The UTF-8 text of the regular file ``path``, at most ``limit`` bytes; ``error`` (one line
    naming the file) when it is missing, not a regular file, larger, binary or not UTF-8.
    ``what`` names what the file should be ("a lock"), ``missing_hint`` says how to make one."""
    p = os.fspath(path)
    try:
        fd = open_regular(p)
    except FileNotFoundError:
        raise error(f"{p} not found", hint=missing_hint) from None
    except UnsafeFile as exc:
        raise error(f"{p} is not {what}: {exc}") from None
    except OSError as exc:
        raise error(f"{p} cannot be read: {(exc.strerror or str(exc)).lower()}") from None
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:  # refused unread: a sparse 50 GB file costs nothing
            raise error(f"{p} is {size / 1e6:.1f} MB; {what} is at most {_mib(limit)}")
        try:
            raw = fh.read(limit + 1)
        except OSError as exc:
            raise error(f"{p} cannot be read: {(exc.strerror or str(exc)).lower()}") from None
    if raw is None or len(raw) > limit:  # a size that lies (/proc), or a file that answers like a device
        raise error(f"{p} is larger than it says; {what} is at most {_mib(limit)}")
    if b"\0" in raw[:_BINARY_PROBE]:
        raise error(f"{p} is a binary file, not {what}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{p} is not UTF-8 text (byte {exc.start})") from None


class FileDigest(NamedTuple):
    hexdigest: str
    size: int  # the bytes hashed


def file_digest(path: str | os.PathLike[str], algorithm: str = "sha256") -> FileDigest:
    """The digest of the file's bytes in ``algorithm`` (any ``hashlib`` name), read in chunks:
    a wheel of gigabytes never sits in memory. ``OSError`` as ``open`` raises it."""
    h = hashlib.new(algorithm)
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return FileDigest(h.hexdigest(), size)


def sha256_file(path: str | os.PathLike[str]) -> str:
    """``sha256:<hex>`` of the file, the form locks, manifests and cache keys write."""
    return "sha256:" + file_digest(path).hexdigest
