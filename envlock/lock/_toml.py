"""A linear-time TOML writer for the shapes a lock has (tables, sub-tables, arrays of tables).

tomlkit keeps a document model whose insertions are linear in the table size, so building a
table of n keys is quadratic (5,000 ``[env]`` keys took 6 s, 20,000 over 100 s); a lock may be
16 MiB. This writer appends to one list and joins once. It reproduces tomlkit's layout for
locks (scalars of a table before its sub-tables, a blank line before every header, a table
with nothing but sub-tables has no header of its own) so existing locks do not churn.

Every string is escaped for TOML's basic strings: JSON's escapes are a subset of TOML's, but
JSON leaves U+007F (DEL) raw, which TOML forbids, and lone surrogates (undecodable bytes in
an environment variable) have no TOML spelling at all: they are refused with ``ValueError``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from datetime import date, datetime, time
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def string(value: str) -> str:
    """A TOML basic string that ``tomllib`` reads back as exactly ``value``."""
    if not value.isascii() and _SURROGATE.search(value):
        raise ValueError(f"a string holds undecodable bytes (a lone surrogate): {value!r:.80}")
    text = json.dumps(value, ensure_ascii=False)
    if "\x7f" in text:
        text = text.replace("\x7f", "\\u007f")
    return text


def key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else string(name)


def value(v: Any) -> str:
    """One TOML value: scalars, arrays and (inside arrays) inline tables."""
    if isinstance(v, str):
        return string(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, datetime):
        text = v.isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    if isinstance(v, (date, time)):
        return v.isoformat()
    if isinstance(v, Mapping):
        inner = ", ".join(f"{key(k)} = {value(x)}" for k, x in v.items())
        return "{ " + inner + " }" if inner else "{}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(value(x) for x in v) + "]"
    raise ValueError(f"cannot write a {type(v).__name__} to TOML")


def _is_table_array(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, Mapping) for x in v)


def table(out: list[str], path: str, body: Mapping[str, Any], comment: str | None = None,
          *, header: bool | None = None) -> None:
    """Append ``[path]`` (its comment, its scalars, then its sub-tables) to ``out``.

    Empty sub-tables and empty arrays are left out, as the lock has always been written.
    ``header=None`` writes the header only when the table has a comment or scalars of its own.
    """
    scalars = [(k, v) for k, v in body.items()
               if not isinstance(v, Mapping) and not _is_table_array(v) and v != []]
    if header is None:
        header = bool(scalars) or comment is not None
    if header:
        out.append(f"\n[{path}]\n")
        if comment is not None:
            out.append(f"# {comment}\n")
        out.extend(f"{key(k)} = {value(v)}\n" for k, v in scalars)
    for k, v in body.items():
        sub = f"{path}.{key(k)}"
        if isinstance(v, Mapping):
            if v:
                table(out, sub, v)
        elif _is_table_array(v):
            array_of_tables(out, sub, v)


def array_of_tables(out: list[str], path: str, rows: Iterable[Mapping[str, Any]]) -> None:
    """Append one ``[[path]]`` block per row; a row's own tables are written inline."""
    for row in rows:
        out.append(f"\n[[{path}]]\n")
        out.extend(f"{key(k)} = {value(v)}\n" for k, v in row.items())


def document(body: Mapping[str, Any]) -> str:
    """A whole document: top-level scalars first, then its tables and arrays of tables."""
    out = [f"{key(k)} = {value(v)}\n" for k, v in body.items()
           if not isinstance(v, Mapping) and not _is_table_array(v)]
    for k, v in body.items():
        if isinstance(v, Mapping):
            table(out, key(k), v, header=True)
        elif _is_table_array(v):
            array_of_tables(out, key(k), v)
    return "".join(out)
