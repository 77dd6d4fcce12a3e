"""Reading ``env.lock``: the one reader, through the models.

``tomllib`` parses (fast, strict); the models validate once, nested tables included; the seal
is checked on the result. ``show`` and ``verify`` read this way too: a second reader that trusted
the seal instead of the models was faster by pydantic's import, and had to be kept in step with
the models by hand.

Each schema version this envlock reads has one entry in ``READERS``; the version a lock
declares picks its reader before anything is validated, and a version with no entry is refused
in words of its own. Only schema 1 exists. When schema 2 does, schema 1 keeps an entry here: a
model of the old tables (a module of its own beside ``_model``) whose reader returns today's
``Lock``, so every lock an older envlock wrote still reads and everything above this module
sees the newest models only; the writer writes the newest version alone.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import ValidationError

from envlock._version import __version__
from envlock.errors import LockInvalid
from envlock.lock._lock import Lock
from envlock.lock._model import SCHEMA_VERSION
from envlock.lock._seal import check_seal
from envlock.lock._text import parse_toml, read_text
from envlock.text.terminal import safe

# Schema version -> the model a lock of that version is validated with.
READERS: dict[int, type[Lock]] = {SCHEMA_VERSION: Lock}
_R = TypeVar("_R")


def _row(loc: tuple[Any, ...], data: Any) -> str | None:
    """The name of the innermost named row ``loc`` passes through (``[[packages]]`` by name)."""
    node, named = data, None
    for key in loc:
        if isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            node = node[key]
            name = node.get("name") if isinstance(node, dict) else None
            named = name if isinstance(name, str) and name else named
        else:
            node = node.get(key) if isinstance(node, dict) else None
    return named


def _where(loc: tuple[Any, ...], data: Any) -> str:
    """``packages.14.version (package torch)``: the path of the field, and the name of the row
    it is in when it has one (the user edits the lock by package, not by index)."""
    named = _row(loc, data)
    where = ".".join(safe(p) for p in loc) or "(document)"
    return f"{where} (package {safe(named[:80])})" if named else where


def _table(loc: tuple[Any, ...], data: Any) -> str:
    """``[envlock]``, ``[[packages]] (package torch)``: the table ``loc`` names, as the TOML
    file writes it."""
    if not loc:
        return "the top level"
    name = ".".join(safe(p) for p in loc if not isinstance(p, int))
    named = _row(loc, data)
    table = f"[[{name}]]" if any(isinstance(p, int) for p in loc) else f"[{name}]"
    return f"{table} (package {safe(named[:80])})" if named else table


def _first_error(exc: ValidationError, data: Any = None) -> str:
    """The error a user fixes first. An unknown key comes before every other: a misspelt key
    also makes the right one missing, and "tool_version: Field required" hid the key to fix."""
    errors = exc.errors()
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    err = unknown[0] if unknown else errors[0]
    extra = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    loc = tuple(err["loc"])
    if not unknown:
        return f"{_where(loc, data)}: {err['msg']}{extra}"
    key, parent = str(loc[-1]), loc[:-1]
    missing = [str(e["loc"][-1]) for e in errors if e["type"] == "missing" and tuple(e["loc"][:-1]) == parent]
    close = difflib.get_close_matches(key, missing, n=1)
    hint = f"; did you mean '{safe(close[0])}'?" if close else ""
    return f"unknown key '{safe(key)}' in {_table(parent, data)}{hint}{extra}"


def schema_reader(readers: Mapping[int, _R], version: object, name: str, *, what: str) -> _R:
    """The reader ``readers`` holds for schema ``version`` of a file (``what``: "lock",
    "record"), or why none does: a newer version is a newer envlock's (upgrade), any other
    number one no envlock wrote. One rule for every format envlock reads, applied before the
    models, since a newer file's fields are not this envlock's. A value that is no number (or
    none: the models' default) gets the newest reader, whose model says what is wrong."""
    newest = max(readers)
    if not isinstance(version, int) or isinstance(version, bool):
        return readers[newest]
    reader = readers.get(version)
    if reader is not None:
        return reader
    if version > newest:
        raise LockInvalid(f"{name} uses {what} schema {version}; this envlock ({__version__}) reads "
                          f"up to {newest}", hint="upgrade envlock")
    raise LockInvalid(f"{name} declares {what} schema {version}, which no envlock wrote; this one "
                      f"reads schema {', '.join(map(str, sorted(readers)))}")


def from_dict(data: dict[str, Any], name: str = "env.lock", *, verify_seal: bool = True) -> Lock:
    """Validate a parsed lock (and by default check its seal); LockInvalid says what is wrong."""
    meta = data.get("envlock")
    if not isinstance(meta, dict):
        raise LockInvalid(f"{name} is not an env.lock: it has no [envlock] table")
    model = schema_reader(READERS, meta.get("schema_version"), name, what="lock")
    try:
        lock = model.model_validate(data)
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
