"""Reading and writing files the probe's way: bounded reads, atomic writes, never raising;
and the one sha256 the probe hashes with.

Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Optional

# The one hash function of the probe (its cache keys, RECORD digests, source digest).
sha256 = hashlib.sha256


def read_text(path: str, limit: int = 1 << 20) -> Optional[str]:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def read_bytes(path: str, limit: int = 4 << 20) -> Optional[bytes]:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
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
