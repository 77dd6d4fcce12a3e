"""The lock writer round-trips every string a model field can hold; the loader is bounded.

The writer test walks the models instead of listing fields by hand, so a field added later is
covered too. The loader fuzz test writes every example to a file and calls ``envlock.load``:
each example reaches the parser and ends as a Lock or as ``LockInvalid``, never as another
exception (a RecursionError or ValueError used to surface as "internal error", exit 3).
"""

from __future__ import annotations

import re
import tempfile
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomllib
from helpers import full_lock, make_lock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from envlock import lock as lockio
from envlock.errors import LockInvalid
from envlock.lock import Lock, _toml

from model_slots import string_slots  # isort: skip

FULL = full_lock()
BASE = FULL.model_dump(mode="json", exclude_none=True)
BASE["envlock"]["created_at"] = FULL.envlock.created_at
# One entry of every list of models, so that each string slot below has a place in BASE.
BASE["unreadable"] = BASE.get("unreadable") or [{"section": "packages", "item": "x-1.0.dist-info",
                                                  "error": "RECORD: not a regular file"}]


SLOTS = [s for s in string_slots(Lock) if s[0][0] != "envlock" or s[0][1] in ("note", "tool_version")]
# Every character TOML must escape, plus what JSON leaves raw: each example holds at least one.
SPECIAL = ["\x7f", "\x00", "\x1b", "\t", "\r", "\n", "\"", "'", "\\", "\u2028", "\x85"]
NASTY = st.tuples(st.text(max_size=12), st.sampled_from(SPECIAL), st.text(max_size=12)).map("".join)


@st.composite
def edited_lock(draw: st.DrawFn) -> dict[str, Any]:
    path, kind, pattern = draw(st.sampled_from(SLOTS))
    text = draw(st.from_regex(pattern, fullmatch=True) if pattern else NASTY)
    doc: Any = typing.cast(Any, __import__("copy").deepcopy(BASE))
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if kind == "value":
        parent[last] = text
    elif kind == "item":
        parent[last] = [text]
    elif kind == "key":
        parent[last] = {text: "INFO" if last == "env" else "v"}
    else:
        parent[last] = {"NCCL_DEBUG" if last in ("env",) else "k": text}
    return typing.cast(dict[str, Any], doc)


def test_the_walk_finds_the_free_text_fields() -> None:
    paths = {s[0] for s in SLOTS}
    assert ("envlock", "note") in paths and ("packages", 0, "requested_revision") in paths
    assert ("gpu", "devices", 0, "name") in paths and ("env",) in paths


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edited_lock())
def test_every_string_a_field_can_hold_round_trips(doc: dict[str, Any]) -> None:
    try:
        lock = lockio.seal(Lock.model_validate(doc))
    except ValidationError:
        # The model refuses the value (a URL validator, a secret-looking [env] name): then no
        # lock can hold it and there is nothing to round-trip. The pattern-driven values above
        # are built to be accepted, so this branch is rare.
        return
    text = lockio.dumps(lock)
    again = lockio.loads(text)
    assert again == lock
    assert lockio.dumps(again) == text


def test_del_round_trips_where_the_old_writer_did_not(tmp_path: Path) -> None:
    lock = make_lock(packages=[{"name": "numpy", "version": "2.1.0", "installer": "pip\x7f"}])
    path = lockio.save(lock, tmp_path / "env.lock")
    assert lockio.load(path).packages[0].installer == "pip\x7f"
    assert _toml.string("a\x7fb") == '"a\\u007fb"'


def test_a_lone_surrogate_is_refused_by_the_writer() -> None:
    with pytest.raises(ValueError, match="surrogate"):
        _toml.string("bad \udcff byte")


def test_floats_beyond_json_are_written_as_toml() -> None:
    doc = tomllib.loads("x = " + _toml.value([float("inf"), -float("inf"), 1e300, 0.1]))
    assert doc["x"] == [float("inf"), -float("inf"), 1e300, 0.1]


@pytest.mark.slow
def test_writer_is_linear_in_table_size() -> None:
    # 20,000 [env] keys took over 100 s with tomlkit; here the whole dump is one join.
    env = {f"CUDA_X{i}": "v" for i in range(20000)}
    text = lockio.dumps(lockio.seal(make_lock(env=env)))
    assert tomllib.loads(text)["env"] == env


# -- loader fuzz ---------------------------------------------------------------------------------

VALID_TEXT = lockio.dumps(FULL)
VALUE_LINES = [m.start(1) for m in re.finditer(r"^[A-Za-z_\"][^=\n]* = (.*)$", VALID_TEXT, re.M)]


def _nested(depth: int, inline: bool) -> str:
    return ("{a=" * depth + "1" + "}" * depth) if inline else ("[" * depth + "1" + "]" * depth)


hostile = st.one_of(
    st.builds(_nested, st.integers(1, 200_000), st.booleans()),
    st.integers(1, 12_000).map(lambda n: "1" * n),
    st.integers(4_290, 4_310).map(lambda n: "-" + "9" * n),
    st.text(max_size=40).map(lambda t: _toml.string(t)),
    st.sampled_from(["nan", "inf", "1979-05-27T07:32:00Z", "0x7fffffffffffffffff", "{}", "[]"]),
)


@pytest.fixture(scope="module")
def lock_file() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp) / "env.lock"


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.sampled_from(VALUE_LINES), hostile, st.booleans(), st.binary(max_size=64))
def test_loader_answers_lock_or_lockinvalid(lock_file: Path, where: int, value: str, append: bool,
                                            noise: bytes) -> None:
    end = VALID_TEXT.index("\n", where)
    text = VALID_TEXT[:where] + value + VALID_TEXT[end:]
    data = text.encode("utf-8") + (b"\n[probe.errors]\nz = " + value.encode() + b"\n" + noise if append else b"")
    lock_file.write_bytes(data)
    try:
        result: Any = lockio.load(lock_file)
    except LockInvalid as exc:
        result = exc
    assert isinstance(result, (Lock, LockInvalid))
    if isinstance(result, LockInvalid):
        assert str(result) and "\n" not in str(result)


@pytest.mark.parametrize("value, message", [
    ("[" * 100_000 + "]" * 100_000, "nest too deeply"),
    ("{a=" * 100_000 + "1" + "}" * 100_000, "nest too deeply"),
    ("1" * 5_000, "4300 digits"),
])
def test_nesting_and_huge_integers_are_lock_invalid(tmp_path: Path, value: str, message: str) -> None:
    path = tmp_path / "env.lock"
    path.write_text(VALID_TEXT.replace('driver = "550"', f"driver = {value}"))
    with pytest.raises(LockInvalid, match=message):
        lockio.load(path)
