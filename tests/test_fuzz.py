"""Hostile lock documents: whatever arrives, the answer is a Lock or LockInvalid, never a crash.

Every example goes through envlock's own loader: the bytes are written to a file and
``lockio.load`` reads them (size, binary and UTF-8 checks, TOML, schema, seal), so no example
is thrown away by the test before envlock sees it. ``hypothesis.event`` records where each
example was refused; ``pytest --hypothesis-show-statistics tests/test_fuzz.py`` shows the split.
Measured with hypothesis 6.170 (before this layout: 251 of 300 random-bytes examples returned
before envlock ran, and 5 of 100 seal edits reached the seal check):
- random bytes: 300 of 300 reach ``load``; about 50% stop at the UTF-8 check, 40% at TOML,
  6% at the binary check, the rest at the schema, and ~2% (a splice into a comment) load;
- seal edits: 200 of 200 examples reach the seal check and raise LockTampered; ``assume``
  discards about 30 more drawn edits, all refused by the schema (an enum or a pattern field).
"""

from __future__ import annotations

import copy
import json
import string
import tempfile
from collections.abc import Callable, Iterator
from datetime import timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from helpers import full_lock, make_lock
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from envlock import lock as lockio
from envlock.errors import LockInvalid, LockTampered
from envlock.lock import Lock

VALID = lockio.seal(make_lock(git={"commit": "a" * 40}, env={"NCCL_DEBUG": "INFO"}))
VALID_TEXT = lockio.dumps(VALID)
VALID_DICT: dict[str, Any] = json.loads(json.dumps(VALID.model_dump(mode="json", exclude_none=True)))
# The seal fuzz edits a lock with every section filled, so most of the schema is in play.
FULL = full_lock()
FULL_DICT: dict[str, Any] = json.loads(json.dumps(FULL.model_dump(mode="json", exclude_none=True)))

# The lock_file fixture is module-scoped on purpose (see there), not reset per example.
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                      HealthCheck.function_scoped_fixture])

toml_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False), st.text(max_size=40),
)
values = st.recursive(
    toml_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


ALL_PATHS = _paths(VALID_DICT)


@pytest.fixture(scope="module")
def lock_file() -> Iterator[Path]:
    # Module-scoped: hypothesis runs every example in one test call, and each example
    # overwrites the file.
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp) / "env.lock"


def _refused_at(exc: LockInvalid) -> str:
    """Which stage of the loader refused the document, for the statistics."""
    msg = str(exc)
    for needle, stage in (("UTF-8", "read: not UTF-8"), ("binary file", "read: binary"),
                          ("not valid TOML", "toml"), ("nest too deeply", "toml: nesting"),
                          ("no [envlock] table", "schema: no [envlock]"), ("lock schema", "schema"),
                          ("not sealed", "seal: missing"), ("edited after capture", "seal: mismatch")):
        if needle in msg:
            return stage
    return "other: " + msg.split(":", 1)[0]


def _load_bytes(lock_file: Path, data: bytes) -> Lock | LockInvalid:
    """``lockio.load`` of ``data``: the Lock, or the LockInvalid it raised (nothing else)."""
    lock_file.write_bytes(data)
    try:
        lock = lockio.load(lock_file)
    except LockInvalid as exc:
        event(_refused_at(exc))
        # The first line is the message the CLI prints: one line, naming what was wrong.
        assert str(exc) and "\n" not in str(exc).split(": ", 1)[0]
        return exc
    event("loaded")
    return lock


def _answer(call: Callable[[], object]) -> None:
    try:
        call()
        event("accepted")
    except LockInvalid as exc:
        event(_refused_at(exc))
        assert str(exc) and "\n" not in str(exc).split(": ", 1)[0]


def _splice(data: tuple[int, bytes]) -> bytes:
    pos, noise = data
    raw = VALID_TEXT.encode()
    return raw[:pos] + noise + raw[pos:]


random_documents = st.one_of(
    st.binary(max_size=2048),  # mostly not UTF-8: the reader must say so, not raise UnicodeDecodeError
    st.text(max_size=512).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.tuples(st.integers(0, len(VALID_TEXT)), st.binary(min_size=1, max_size=16)).map(_splice),
)


@pytest.mark.slow
@settings(FUZZ, max_examples=300)
@given(data=random_documents)
def test_random_bytes(lock_file: Path, data: bytes) -> None:
    result = _load_bytes(lock_file, data)
    if isinstance(result, Lock):
        # Only a splice into a comment or between tokens can leave a lock that still loads;
        # then it must be the same environment, seal intact.
        assert result == VALID


def test_invalid_utf8_is_lock_invalid_not_unicode_error(tmp_path: Path) -> None:
    path = tmp_path / "env.lock"
    path.write_bytes(VALID_TEXT.encode()[:40] + b"\xff\xfe" + VALID_TEXT.encode()[40:])
    with pytest.raises(LockInvalid, match=r"not UTF-8 text \(byte 40\)"):
        lockio.load(path)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.sampled_from(ALL_PATHS), values, st.sampled_from(["set", "delete", "add"]))
def test_structural_mutations(path: tuple[Any, ...], value: Any, action: str) -> None:
    # Values here include None and mixed arrays, which TOML cannot hold: this one enters the
    # loader after the TOML stage, at ``from_dict`` (schema, then seal).
    doc = copy.deepcopy(VALID_DICT)
    parent = _get(doc, path[:-1])
    last = path[-1]
    if action == "delete":
        del parent[last]
    elif action == "set":
        parent[last] = value
    elif isinstance(parent, dict):
        parent[f"x_{last}"] = value
    else:
        parent.append(value)
    _answer(lambda: lockio.from_dict(doc))


@pytest.mark.slow
@settings(FUZZ, max_examples=300)
@given(pos=st.integers(min_value=0, max_value=len(VALID_TEXT) - 1), insert=st.text(max_size=6),
       delete=st.integers(0, 6))
def test_text_mutations(lock_file: Path, pos: int, insert: str, delete: int) -> None:
    text = VALID_TEXT[:pos] + insert + VALID_TEXT[pos + delete:]
    result = _load_bytes(lock_file, text.encode("utf-8", "surrogatepass"))
    if isinstance(result, Lock):
        assert result == VALID


# -- the seal ------------------------------------------------------------------------------------

SEAL_PATHS = [p for p in _paths(FULL_DICT)
              if p != ("envlock", "schema_version")  # a newer schema is refused before the seal
              and not isinstance(_get(FULL_DICT, p), (dict, list))]
LIST_PATHS = [p for p in _paths(FULL_DICT) if isinstance(_get(FULL_DICT, p), list) and _get(FULL_DICT, p)]
_CLASSES = ("0123456789", "abcdef", string.ascii_lowercase, string.ascii_uppercase)


@st.composite
def _edited(draw: st.DrawFn, value: Any) -> Any:
    """A value of the same type as ``value``, and for strings of the same shape, so the schema
    (patterns, enums aside) still accepts it and only the seal is left to catch the edit."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + draw(st.integers(1, 1000) | st.integers(-1000, -1))
    if isinstance(value, float):
        return draw(st.floats(allow_nan=False, allow_infinity=False))
    assert isinstance(value, str)
    if not value:
        return draw(st.text(string.ascii_letters, min_size=1, max_size=8))
    i = draw(st.integers(0, len(value) - 1))
    pool = next((c for c in _CLASSES if value[i] in c), string.ascii_letters).replace(value[i], "")
    return value[:i] + draw(st.sampled_from(pool)) + value[i + 1:]


@st.composite
def sealed_edit(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    doc = copy.deepcopy(FULL_DICT)
    if draw(st.integers(0, 9)) == 0:
        path = draw(st.sampled_from(LIST_PATHS))
        items = _get(doc, path)
        del items[draw(st.integers(0, len(items) - 1))]
        return "drop a list item", doc
    path = draw(st.sampled_from(SEAL_PATHS))
    parent = _get(doc, path[:-1])
    parent[path[-1]] = draw(_edited(parent[path[-1]]))
    return "edit " + (path[0] if path[0] != "envlock" else ".".join(map(str, path[:2]))), doc


@pytest.mark.slow
@settings(FUZZ, max_examples=200)
@given(sealed_edit())
def test_any_content_edit_breaks_the_seal(lock_file: Path, edit: tuple[str, dict[str, Any]]) -> None:
    kind, doc = edit
    try:
        edited = lockio.from_dict(doc, verify_seal=False)
    except LockInvalid:
        assume(False)  # the schema refused the value: no lock can hold it, nothing to seal
        raise
    # Normalisation (name case, list order) can undo an edit; only a real change counts.
    assume(edited.model_dump(exclude={"envlock": {"fingerprint", "integrity"}})
           != FULL.model_dump(exclude={"envlock": {"fingerprint", "integrity"}})
           or (edited.envlock.fingerprint, edited.envlock.integrity)
           != (FULL.envlock.fingerprint, FULL.envlock.integrity))
    event(kind)
    lock_file.write_text(lockio.dumps(edited))  # the edited values under the old hashes
    with pytest.raises(LockTampered):
        lockio.load(lock_file)


def _string_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(doc, str):
        return [prefix]
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    return [p for k, v in items for p in _string_paths(v, (*prefix, k))]


# Every string of a lock with every section filled; created_at is a date-time field of its own.
STRING_PATHS = [p for p in _string_paths(FULL_DICT) if p != ("envlock", "created_at")]
# TOML offsets are whole minutes (a zone's historical +02:35:20 has no TOML spelling).
_offsets = st.integers(-1439, 1439).map(lambda m: timezone(timedelta(minutes=m)))
toml_dates = st.one_of(st.datetimes(timezones=st.none() | _offsets), st.dates(), st.times())


def _toml_text(doc: dict[str, Any]) -> str:
    """``doc`` as TOML through the writer's own value rules (which write dates natively)."""
    from envlock.lock import _toml

    out: list[str] = []
    for key, value in doc.items():
        if isinstance(value, dict):
            _toml.table(out, key, value, None)
        else:
            _toml.array_of_tables(out, key, value)
    return "".join(out)


@pytest.mark.slow
@settings(FUZZ, max_examples=400)
@given(path=st.sampled_from(STRING_PATHS), value=toml_dates, sealed=st.booleans(),
       command=st.sampled_from(["fmt", "show", "diff"]))
def test_a_date_or_time_where_a_string_belongs_is_exit_2_naming_the_field(
        lock_file: Path, path: tuple[Any, ...], value: Any, sealed: bool, command: str) -> None:
    """A TOML date, time or date-time in any string field, sealed or not, through the reader
    (``_text``: bytes and TOML; ``_read``: the models) of the commands that read a lock."""
    import contextlib
    import io

    from envlock.commands import main

    doc = copy.deepcopy(FULL_DICT)
    if not sealed:
        del doc["envlock"]["fingerprint"], doc["envlock"]["integrity"]
    _get(doc, path[:-1])[path[-1]] = value
    lock_file.write_text(_toml_text(doc), encoding="utf-8")
    event(f"{command} {path[0]}")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main([command, str(lock_file)] + ([str(lock_file)] if command == "diff" else []))
    message = err.getvalue()
    assert code == 2, message
    assert "internal error" not in message
    assert ".".join(str(p) for p in path) in message, message
