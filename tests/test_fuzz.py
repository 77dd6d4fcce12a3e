"""Hostile lock documents: whatever arrives, the answer is a Lock or LockInvalid, never a crash."""

from __future__ import annotations

import copy
import json
from typing import Any

from helpers import make_lock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envlock import lockfile
from envlock.errors import LockInvalid

VALID = lockfile.seal(make_lock(git={"commit": "a" * 40}, env={"NCCL_DEBUG": "INFO"}))
VALID_TEXT = lockfile.dumps(VALID)
VALID_DICT: dict[str, Any] = json.loads(json.dumps(VALID.model_dump(mode="json", exclude_none=True)))

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


ALL_PATHS = _paths(VALID_DICT)


def _accepts_or_rejects(call: Any) -> None:
    try:
        call()
    except LockInvalid as exc:
        assert str(exc) and "\n" not in str(exc).split(": ", 1)[0]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_random_bytes(data: bytes) -> None:
    def call() -> None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return
        lockfile.parse(text)

    _accepts_or_rejects(call)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(ALL_PATHS), values, st.sampled_from(["set", "delete", "add"]))
def test_structural_mutations(path: tuple[Any, ...], value: Any, action: str) -> None:
    doc = copy.deepcopy(VALID_DICT)
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if action == "delete":
        del parent[last]
    elif action == "set":
        parent[last] = value
    elif isinstance(parent, dict):
        parent[f"x_{last}"] = value
    else:
        parent.append(value)
    _accepts_or_rejects(lambda: lockfile.from_dict(doc))


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=len(VALID_TEXT) - 1), st.text(max_size=6), st.integers(0, 6))
def test_text_mutations(pos: int, insert: str, delete: int) -> None:
    text = VALID_TEXT[:pos] + insert + VALID_TEXT[pos + delete:]
    _accepts_or_rejects(lambda: lockfile.parse(text))


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([p for p in ALL_PATHS if p[0] not in ("envlock",)]), toml_scalars)
def test_any_content_edit_breaks_the_seal(path: tuple[Any, ...], value: Any) -> None:
    doc = copy.deepcopy(VALID_DICT)
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    if parent[path[-1]] == value or value is None or isinstance(parent[path[-1]], (dict, list)):
        return
    parent[path[-1]] = value
    try:
        lockfile.from_dict(doc)
    except LockInvalid:
        return
    raise AssertionError(f"edit at {path} to {value!r} was accepted")
