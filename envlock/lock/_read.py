"""Reading ``env.lock``: the one reader, through the models.

``tomllib`` parses (fast, strict); the models validate once, nested tables included; the seal
is checked on the result. ``show`` and ``verify`` read this way too: a second reader that trusted
the seal instead of the models was faster by pydantic's import, and had to be kept in step with
the models by hand.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import ValidationError

from envlock._version import __version__
from envlock.errors import LockInvalid
from envlock.lock._lock import Lock
from envlock.lock._model import SCHEMA_VERSION
from envlock.lock._seal import check_seal
from envlock.lock._text import parse_toml, read_text


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
    return from_dict(parse_toml(text, name), name, verify_seal=verify_seal)


def load(path: str | os.PathLike[str], *, verify_seal: bool = True) -> Lock:
    """Read, validate and (by default) check the seal of a lock file."""
    return loads(read_text(path), str(path), verify_seal=verify_seal)
