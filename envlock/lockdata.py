"""Reading a sealed lock without pydantic: the fast path of ``verify`` and ``show``.

Importing pydantic and building envlock's models costs more than the rest of a ``verify
--no-torch`` together (issue 11), yet a lock that envlock wrote was validated when it was
written, and its ``integrity`` hash says whether a single byte of its content changed since.
So a lock is read here into its canonical form (what the models dump to), with every missing
key filled with what the model's default means (``lockshape``, generated from the models), and
its two hashes are checked over that form (``lockcore``, the same code that seals). When they
match, the content is exactly what a validated lock dumped; ``LockView`` then answers the
attribute reads that comparing and rendering do.

Anything else - not sealed, edited, another schema version, a key the shape does not know - is
not read here at all (``light_load`` returns None) and goes through the models, which give the
errors and exit codes they always gave. Being wrong here can only cost speed, never a verdict:
a form that differs from the model's by one value fails the hash check.
"""

from __future__ import annotations

import os
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, cast

from envlock import __version__
from envlock.errors import LockInvalid
from envlock.lockcore import REQUIRED, ROOT, SCHEMA_VERSION, os_versions, seal_matches, short_id
from envlock.lockshape import SHAPES

# A lock is at most this big: far above any real one, and small enough that a wrong file (a
# dataset, a checkpoint) is refused before it is read into memory.
MAX_LOCK_BYTES = 16 * 1024 * 1024

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

if TYPE_CHECKING:
    from envlock.model import Lock, Package

# name -> (kind, nested model, default) for each model, from the generated shapes.
_FIELDS: dict[str, dict[str, tuple[str, str | None, Any]]] = {
    model: {name: (kind, ref, default) for name, kind, ref, default in rows}
    for model, rows in SHAPES.items()
}


class _NotCanonical(LockInvalid):
    """The data is not what a lock of this schema dumps to; the models will say why.

    Caught inside this module (the lock then goes through the models, which give the real
    error): a LockInvalid only so that, if it ever escaped, it would still mean exit 2."""


def read_text(path: str | os.PathLike[str]) -> str:
    p = os.fspath(path)  # not pathlib: verify reads a lock without importing it
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


def parse_toml(text: str, name: str = "env.lock") -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LockInvalid(f"{name} is not valid TOML: {exc}") from None
    except RecursionError:
        raise LockInvalid(f"{name} is not a lock: its arrays or tables nest too deeply") from None
    except ValueError as exc:
        # int() refuses integers of more than 4,300 digits (CVE-2020-10735 guard).
        raise LockInvalid(f"{name} is not a lock: {exc}") from None


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def json_datetime(value: datetime) -> str:
    """A datetime as pydantic's JSON mode writes it (UTC as ``Z``)."""
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def canonical(model: str, data: Any) -> dict[str, Any]:
    """``data`` (TOML or a probe document) in the form ``model`` dumps to: field order, missing
    keys as the model's defaults, None left out. Raises _NotCanonical where the models would
    have to decide (an unknown key, a missing required one, a table where a value should be)."""
    if not isinstance(data, dict):
        raise _NotCanonical(model)
    fields = _FIELDS[model]
    if not data.keys() <= fields.keys():
        raise _NotCanonical(model)
    out: dict[str, Any] = {}
    for name, (kind, ref, default) in fields.items():
        value = data.get(name)
        if value is None:
            if default is REQUIRED or (name in data and default is not None):
                raise _NotCanonical(f"{model}.{name}")
            if default is not None:
                out[name] = _copy(default)
        elif kind == "model":
            out[name] = canonical(cast(str, ref), value)
        elif kind == "models":
            if not isinstance(value, list):
                raise _NotCanonical(f"{model}.{name}")
            out[name] = [canonical(cast(str, ref), item) for item in value]
        elif kind == "datetime":
            if not isinstance(value, datetime):
                raise _NotCanonical(f"{model}.{name}")
            out[name] = json_datetime(value)
        else:
            out[name] = value
    return out


class LockView:
    """A read-only lock (or one of its tables) over its canonical form.

    Answers what a model answers to the code that compares and renders: attributes (nested
    tables as views, a missing optional value as None), ``model_dump(mode="json",
    exclude_none=True)``, ``model_copy(update=...)``, equality. Its data is never modified.
    """

    __slots__ = ("_cache", "_data", "_model")

    def __init__(self, model: str, data: dict[str, Any]) -> None:
        self._model = model
        self._data = data
        self._cache: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._cache[name]
        except KeyError:
            pass
        try:
            kind, ref, _ = _FIELDS[self._model][name]
        except KeyError:
            raise AttributeError(f"{self._model} has no field {name!r}") from None
        value = self._data.get(name)
        if value is not None:
            if kind == "model":
                value = view(cast(str, ref), value)
            elif kind == "models":
                value = [view(cast(str, ref), item) for item in value]
            elif kind == "datetime":
                value = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
        self._cache[name] = value
        return value

    def model_dump(self, *, mode: str = "json", exclude_none: bool = True) -> dict[str, Any]:
        if mode != "json" or not exclude_none:
            raise NotImplementedError("a lock view only has its canonical (JSON) form")
        return cast(dict[str, Any], _copy(self._data))

    def model_copy(self, *, update: dict[str, Any] | None = None) -> Any:
        data = dict(self._data)
        for key, value in (update or {}).items():
            if key not in _FIELDS[self._model]:
                raise AttributeError(f"{self._model} has no field {key!r}")
            if value is None:
                data.pop(key, None)
            elif isinstance(value, LockView):
                data[key] = value._data
            elif isinstance(value, list):
                data[key] = [v._data if isinstance(v, LockView) else v for v in value]
            else:
                data[key] = value
        return view(self._model, data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LockView):
            return NotImplemented
        return self._model == other._model and self._data == other._data

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LockView({self._model}, {len(self._data)} fields)"


class _LockRoot(LockView):
    __slots__ = ()

    @property
    def short_id(self) -> str:
        return short_id(self._data["envlock"].get("fingerprint"))

    def package(self, name: str) -> Package | None:
        from envlock.probe.rules import canonicalize_name

        wanted = canonicalize_name(name)
        return next((p for p in self.packages if p.name == wanted), None)


class _OsPackagesView(LockView):
    __slots__ = ()

    def versions(self) -> dict[str, str]:
        return os_versions(self._data.get("packages", []))


_VIEWS: dict[str, type[LockView]] = {ROOT: _LockRoot, "OsPackages": _OsPackagesView}


def view(model: str, data: dict[str, Any]) -> Any:
    return _VIEWS.get(model, LockView)(model, data)


def is_view(lock: object) -> bool:
    """Whether ``lock`` was read here (a view) rather than validated through the models."""
    return isinstance(lock, LockView)


def light_data(data: dict[str, Any]) -> dict[str, Any] | None:
    """The canonical form of a parsed lock when it is sealed, of this schema, and both hashes
    match; None sends the lock through the models instead."""
    meta = data.get("envlock")
    if not isinstance(meta, dict) or meta.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        return None
    try:
        form = canonical(ROOT, data)
    except (_NotCanonical, RecursionError):
        return None
    return form if seal_matches(form) else None


def read_data(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The lock at ``path`` as parsed TOML, raising what ``load`` raises for a file it cannot
    read. Read once: ``light_view`` tries it, and ``lockfile.from_dict`` takes it when that
    answers None."""
    return parse_toml(read_text(path), str(path))


def light_view(data: dict[str, Any]) -> Lock | None:
    """A parsed lock as a view, or None where only the models can read it (see the module
    docstring). ``data`` is not modified."""
    form = light_data(data)
    return None if form is None else cast("Lock", view(ROOT, form))


def light_load(path: str | os.PathLike[str]) -> Lock | None:
    """The lock at ``path`` as a view, or None where only the models can read it."""
    return light_view(read_data(path))


def light_current(doc: dict[str, Any]) -> Lock | None:
    """A probe document (as ``build_lock`` prepares it) as a view of a lock, not validated.

    Only for comparing with a lock read by ``light_load``: the probe is envlock's own code and
    its values are compared, never written or sealed. None when the document holds something
    the models would have to judge (``build_lock`` then raises the error capture would)."""
    meta = {"tool_version": __version__, "created_at": datetime.now(timezone.utc).replace(microsecond=0)}
    try:
        form = canonical(ROOT, {**doc, "envlock": meta})
    except (_NotCanonical, RecursionError):
        return None
    return cast("Lock", view(ROOT, form))
