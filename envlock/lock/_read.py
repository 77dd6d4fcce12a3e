"""Reading ``env.lock``: the one reader, through the models.

``tomllib`` parses (fast, strict); the models validate once, nested tables included; the seal
is checked on the result. ``show`` and ``verify`` read this way too: a second reader that trusted
the seal instead of the models was faster by pydantic's import, and had to be kept in step with
the models by hand.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from pydantic import ValidationError

from envlock import __version__
from envlock.errors import LockInvalid
from envlock.lock._model import SCHEMA_VERSION, Lock
from envlock.lock._seal import check_seal
from envlock.lockscan import MAX_LOCK_BYTES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


def read_text(path: str | os.PathLike[str]) -> str:
    """The text of the lock at ``path``, refused (LockInvalid) when it cannot be a lock."""
    p = os.fspath(path)
    try:
        size = os.stat(p).st_size
        if size > MAX_LOCK_BYTES:
            raise LockInvalid(
                f"{p} is {size / 1e6:.1f} MB; a lock is at most {MAX_LOCK_BYTES // (1 << 20)} MiB"
            )
        with open(p, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise LockInvalid(f"{p} not found", hint="create one with `envlock capture`") from None
    except IsADirectoryError:
        raise LockInvalid(f"{p} is a directory, not a lock file") from None
    except PermissionError:
        raise LockInvalid(f"{p} cannot be read: permission denied") from None
    if b"\0" in raw[:8192]:
        raise LockInvalid(f"{p} is a binary file, not an env.lock")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LockInvalid(f"{p} is not UTF-8 text (byte {exc.start})") from None


def _parse_toml(text: str, name: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LockInvalid(f"{name} is not valid TOML: {exc}") from None
    except RecursionError:
        raise LockInvalid(f"{name} is not a lock: its arrays or tables nest too deeply") from None
    except ValueError as exc:
        # int() refuses integers of more than 4,300 digits (CVE-2020-10735 guard).
        raise LockInvalid(f"{name} is not a lock: {exc}") from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(document)"
    extra = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    return f"{loc}: {msg}{extra}"


def from_dict(data: dict[str, Any], name: str = "env.lock", *, verify_seal: bool = True) -> Lock:
    """Validate a parsed lock (and by default check its seal); LockInvalid says what is wrong."""
    meta = data.get("envlock")
    if not isinstance(meta, dict):
        raise LockInvalid(f"{name} is not an env.lock: it has no [envlock] table")
    version = meta.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise LockInvalid(
            f"{name} uses lock schema {version}; this envlock ({__version__}) reads up to "
            f"{SCHEMA_VERSION}",
            hint="upgrade envlock",
        )
    try:
        lock = Lock.model_validate(data)
    except ValidationError as exc:
        raise LockInvalid(f"{name} does not match the lock schema: {_first_error(exc)}") from None
    except RecursionError:
        raise LockInvalid(f"{name} does not match the lock schema: values nest too deeply") from None
    if verify_seal:
        check_seal(lock, name)
    return lock


def loads(text: str, name: str = "env.lock", *, verify_seal: bool = True) -> Lock:
    """A lock from its TOML text (``name`` is what errors call it)."""
    return from_dict(_parse_toml(text, name), name, verify_seal=verify_seal)


def load(path: str | os.PathLike[str], *, verify_seal: bool = True) -> Lock:
    """Read, validate and (by default) check the seal of a lock file."""
    return loads(read_text(path), str(path), verify_seal=verify_seal)
