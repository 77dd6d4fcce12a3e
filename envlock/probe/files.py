"""Reading and writing files the probe's way: bounded reads, atomic writes, never raising;
and the one sha256 the probe hashes with.

Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import json
import os

TYPE_CHECKING = False  # typing is imported by the type checker only, see rules.py
if TYPE_CHECKING:
    from hashlib import _Hash
    from typing import Any, Callable, Optional


def _sha256_constructor() -> Callable[..., _Hash]:
    """CPython's own sha256 (``_sha256``, ``_sha2`` from 3.12), else hashlib's.

    ``import hashlib`` loads OpenSSL, ~3 ms of a ~40 ms probe run without torch; what the probe
    hashes on every run is small (RECORD lines, a git diff, its own files), where the built-in
    implementation is as good. Both compute the same function; hashlib stays the fallback for
    builds without the built-in modules.
    """
    try:
        from _sha256 import sha256  # type: ignore[import-not-found]  # Python 3.8-3.11
    except ImportError:
        try:
            from _sha2 import sha256  # type: ignore[import-not-found]  # 3.12+
        except ImportError:
            from hashlib import sha256
    constructor: Callable[..., _Hash] = sha256
    return constructor


sha256 = _sha256_constructor()


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
