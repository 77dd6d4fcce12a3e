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

from envlock._textsafe import safe
from envlock._version import __version__
from envlock.errors import LockInvalid
from envlock.lock._lock import Lock
from envlock.lock._model import SCHEMA_VERSION
from envlock.lock._seal import check_seal
from envlock.lock._text import parse_toml, read_text


def _where(loc: tuple[Any, ...], data: Any) -> str:
    """``packages.14.version (package torch)``: the path of the field, and the name of the row
    it is in when it has one (the user edits the lock by package, not by index)."""
    node, named = data, None
    for key in loc:
        if isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            node = node[key]
            name = node.get("name") if isinstance(node, dict) else None
            named = name if isinstance(name, str) and name else named
        else:
            node = node.get(key) if isinstance(node, dict) else None
    where = ".".join(safe(p) for p in loc) or "(document)"
    return f"{where} (package {safe(named[:80])})" if named else where


def _first_error(exc: ValidationError, data: Any = None) -> str:
    err = exc.errors()[0]
    loc = _where(tuple(err["loc"]), data)
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
        raise LockInvalid(f"{name} does not match the lock schema: {_first_error(exc, data)}") from None
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
