"""The lock's sealed header: the second door, for the paths whose answer a seal already gives.

``load()`` (``_read``) is the one reader: ``tomllib``, then the models, then the seal. Building
the models costs pydantic's import and schema generation, more than the rest of a warm
``verify`` or of ``envlock run``'s start together, yet on those paths the answer is already
known once the lock is known: a verdict kept for a lock of this integrity (``check/kept``), an
image proven for it (``restore/inside``). Both were kept by a command that read the lock through
the models, so a table that hashes to the same integrity is a form the models accepted.

``header(path)`` reads the same file through the same first stage (``_text``: size, regular
file, encoding, ``tomllib``) and recomputes both hashes over the TOML table itself with the
seal's own functions (``_seal``, no pydantic). When the table declares the newest schema and
both hashes verify, the header is taken from the table: the schema version, the two hashes, the
short id and the few fields a fast path uses (the tables a verify's probe is chosen by, the
prefix it was captured in, the torch version and CUDA a run's GPU check reads, the variables it
passes on). Anything else (another schema version, no seal, a seal that does
not verify over the table, a value of the wrong type) goes to ``load()``, which gives its own
answer: its refusal in its words and exit code, or the lock, whose header is then taken from the
models. So ``header()`` and ``load()`` agree on every file but one kind: a table whose seal was
recomputed by hand over a value the models refuse. That one is accepted here and refused by
``load()``; no fast path answers for it, because the answers they reuse were kept for an
integrity ``load()`` accepted, and this table has another.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from envlock.errors import LockTampered
from envlock.lock._derived import EMPTY_DEFAULTS
from envlock.lock._seal import check_hashes, sealed_form, short_id
from envlock.lock._text import SCHEMA_VERSION, parse_toml, read_text

if TYPE_CHECKING:
    from envlock.lock._lock import Lock


@dataclass(frozen=True)
class HeaderMeta:
    """``[envlock]``'s schema version and the two hashes (``Meta``'s names)."""

    schema_version: int
    fingerprint: str | None
    integrity: str | None


@dataclass(frozen=True)
class HeaderTorch:
    """What a run's GPU check reads of ``[torch]`` (``TorchInfo``'s names)."""

    version: str
    cuda: str | None


@dataclass(frozen=True)
class HeaderPython:
    """Where the lock was captured (``PythonInfo.prefix``): verify names it when it exists here
    and another environment was checked."""

    prefix: str | None


@dataclass(frozen=True)
class HeaderDeterminism:
    """The variables of ``[determinism]`` a run passes on (``Determinism``'s names)."""

    env: Mapping[str, str] = field(default_factory=dict)
    process_env: tuple[str, ...] = ()


@dataclass(frozen=True)
class Header:
    """A lock's sealed header, named as the models name the same fields, so a function that reads
    only these takes either (``Lock | Header``) and mypy checks every read on both.

    ``lock`` is the lock the models read when the table alone could not answer (None when it
    did): a caller that needs the whole lock on that path does not read it twice.
    """

    envlock: HeaderMeta
    tables: frozenset[str]  # the top-level tables the lock has (``check/local.probe_wanted``)
    python: HeaderPython
    torch: HeaderTorch | None
    determinism: HeaderDeterminism
    env: Mapping[str, str]
    lock: Lock | None = field(default=None, repr=False, compare=False)

    @property
    def short_id(self) -> str:
        return short_id(self.envlock.fingerprint)

    @classmethod
    def of(cls, lock: Lock) -> Header:
        """The header of a lock the models read."""
        torch = HeaderTorch(lock.torch.version, lock.torch.cuda) if lock.torch is not None else None
        meta = lock.envlock
        tables = frozenset(name for name in type(lock).model_fields if getattr(lock, name) is not None)
        return cls(envlock=HeaderMeta(meta.schema_version, meta.fingerprint, meta.integrity),
                   tables=tables, python=HeaderPython(lock.python.prefix), torch=torch,
                   determinism=HeaderDeterminism(dict(lock.determinism.env),
                                                 tuple(lock.determinism.process_env)),
                   env=dict(lock.env), lock=lock)


def header(path: str | os.PathLike[str], *, text: str | None = None) -> Header:
    """The sealed header of the lock at ``path``: from its TOML table when the newest schema's
    seal verifies over it, else from ``load()``'s lock (whose refusals are raised as they are).
    ``text``: the file's text as ``read_text`` already read it, for a caller that keyed an answer
    on that text (``check/kept``) and must read the header of the very same one."""
    name = str(path)
    data = parse_toml(read_text(path) if text is None else text, name)
    found = _sealed(data, name)
    if found is not None:
        return found
    from envlock.lock._read import from_dict

    return Header.of(from_dict(data, name))


def _sealed(data: dict[str, Any], name: str) -> Header | None:
    """The header of ``data`` when both hashes verify over it, or None (the models decide)."""
    meta = data.get("envlock")
    if not isinstance(meta, dict) or type(meta.get("schema_version")) is not int \
            or meta["schema_version"] != SCHEMA_VERSION:
        return None
    try:
        check_hashes(meta.get("fingerprint"), meta.get("integrity"), sealed_form(_dumped(data)), name)
        return _from_table(data)
    except (LockTampered, TypeError, ValueError, AttributeError, RecursionError):
        # A seal that does not verify over the table may verify over the models' form of it
        # (a table written in another order, a default left out), and a value of another type
        # is the models' to name: load() answers both.
        return None


def _filled(data: Any, empty: dict[str, Any]) -> Any:
    """``data`` with the empty lists and tables the writer left out put back (``empty``:
    ``EMPTY_DEFAULTS``'s shape); ``data`` itself is kept as it was."""
    if isinstance(data, list):
        every = empty.get("__all__")
        return [_filled(row, every) for row in data] if every is not None else data
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for key, sub in empty.items():
        if key in ("__all__", "__default__"):
            continue
        if key not in out:
            value = sub.get("__default__") if isinstance(sub, dict) and sub else sub
            if isinstance(value, (list, dict)) and not value:
                out[key] = type(value)()
        elif isinstance(sub, dict) and sub:
            out[key] = _filled(out[key], sub)
    return out


def _dumped(data: dict[str, Any]) -> dict[str, Any]:
    """The table as the models would dump it, when it is what the writer wrote: the empty lists
    and tables put back, and ``created_at`` (a TOML date-time, which the models require) as the
    models write it in JSON. Anything else differing from the dump makes the hashes differ, and
    the models answer. A ``created_at`` of any other type is refused here for the same reason:
    a string would hash like the dump, and the models refuse it."""
    form: dict[str, Any] = _filled(data, EMPTY_DEFAULTS)
    meta = dict(form["envlock"])
    created = meta.get("created_at")
    if created is not None:
        if not isinstance(created, datetime):
            raise TypeError("created_at is not a date-time")
        meta["created_at"] = created.isoformat().replace("+00:00", "Z")
    form["envlock"] = meta
    return form


def _text(value: object, *, optional: bool) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise TypeError("not a string")
    return value


def _strings(value: object) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in value.items()):
        raise TypeError("not a table of strings")
    return dict(value)


def _from_table(data: dict[str, Any]) -> Header:
    """The header's fields, typed, from a table whose seal verified (TypeError: the models
    decide). A table is absent where the model's default is None, and empty where it is empty."""
    meta = data["envlock"]
    torch = data.get("torch")
    if torch is not None:
        if not isinstance(torch, dict):
            raise TypeError("[torch] is not a table")
        torch = HeaderTorch(str(_text(torch.get("version"), optional=False)),
                            _text(torch.get("cuda"), optional=True))
    det = data.get("determinism", {})
    if not isinstance(det, dict):
        raise TypeError("[determinism] is not a table")
    process_env = det.get("process_env", [])
    if not isinstance(process_env, list) or not all(isinstance(v, str) for v in process_env):
        raise TypeError("process_env is not a list of strings")
    python = data.get("python")
    if not isinstance(python, dict):
        raise TypeError("[python] is not a table")
    return Header(envlock=HeaderMeta(meta["schema_version"], _text(meta.get("fingerprint"), optional=True),
                                     _text(meta.get("integrity"), optional=True)),
                  tables=frozenset(data), python=HeaderPython(_text(python.get("prefix"), optional=True)),
                  torch=torch,
                  determinism=HeaderDeterminism(_strings(det.get("env", {})), tuple(process_env)),
                  env=_strings(data.get("env", {})))
