"""The sealed header (``lock.header``) against the one reader (``lock.load``): on every lock the
suite writes, and on fuzzed and hand-edited ones, both give the same id, fingerprint and
integrity, or the same refusal (type, words, exit code). The one kind they may disagree on, a
table whose seal was recomputed by hand over a value the models refuse, is accepted by the
header alone, and no fast path answers for it (``test_header_fast_paths.py``)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import full_lock, make_lock, resealed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envlock.errors import EnvlockError
from envlock.lock import Header, Lock, dumps, header, load
from envlock.lock import toml_document as document
from envlock.lock.__main__ import DERIVED_FILE, derived_source

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "sealed"


def _outcome(read: object, path: Path) -> tuple[str, ...]:
    """What a reader says of ``path``: its id, fingerprint and integrity, or its refusal."""
    try:
        found = read(path)  # type: ignore[operator]
    except EnvlockError as exc:
        return ("refused", type(exc).__name__, exc.message, str(exc.hint), str(exc.exit_code))
    assert isinstance(found, (Lock, Header))
    return ("read", found.short_id, str(found.envlock.fingerprint), str(found.envlock.integrity))


def _agree(path: Path) -> Header | None:
    """Assert header() and load() agree on ``path``; the header, when one was read."""
    by_models, by_header = _outcome(load, path), _outcome(header, path)
    assert by_header == by_models
    return header(path) if by_header[0] == "read" else None


@functools.cache
def _written_locks() -> list[Lock]:
    """The locks the suite writes: the factory's defaults, every section filled, no torch, and
    rows whose empty lists the writer leaves out."""
    return [make_lock(), full_lock(), make_lock(torch=None),
            make_lock(packages=[("six", "1.16.0"), {"name": "idna", "version": "3.10", "hashes": []}])]


def test_derived_literals_are_not_stale() -> None:
    """``_derived.py`` is what the models give now (regenerate: ``python -m envlock.lock``)."""
    assert DERIVED_FILE.read_text(encoding="utf-8") == derived_source()


@pytest.mark.parametrize("index", range(4))
def test_every_lock_the_suite_writes_is_read_by_its_table_alone(tmp_path: Path, index: int) -> None:
    lock = _written_locks()[index]
    path = tmp_path / "env.lock"
    lock.save(path)
    found = _agree(path)
    assert found is not None and found.lock is None  # the table answered, no model was built
    assert found.envlock.fingerprint == lock.envlock.fingerprint
    assert (found.torch.cuda if found.torch else None) == (lock.torch.cuda if lock.torch else None)
    assert dict(found.determinism.env) == lock.determinism.env and dict(found.env) == lock.env
    assert list(found.determinism.process_env) == lock.determinism.process_env


def test_the_fixtures_agree(tmp_path: Path) -> None:
    for fixture in sorted(FIXTURES.glob("*.lock")):
        target = tmp_path / fixture.name
        shutil.copy(fixture, target)
        _agree(target)
    assert header(tmp_path / "rich.lock").lock is None


def test_reading_a_header_imports_no_pydantic(tmp_path: Path) -> None:
    path = tmp_path / "env.lock"
    full_lock().save(path)
    code = ("import sys; from envlock.lock import header; h = header(sys.argv[1]); "
            "assert h.lock is None; bad = [m for m in ('pydantic', 'envlock.lock._model') if m in sys.modules]; "
            "print(h.short_id, bad)")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert done.stdout.split() == [full_lock().short_id, "[]"]


@pytest.mark.parametrize("text, words", [
    ("", "no [envlock] table"),
    ("[envlock]\nschema_version = 99\n", "schema 99"),
    ("[envlock]\nschema_version = 0\n", "no envlock wrote"),
    ("[envlock]\nschema_version = true\n", "schema"),
    ("[envlock\n", "not valid TOML"),
])
def test_refusals_before_the_seal_are_loads(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "env.lock"
    path.write_text(text, encoding="utf-8")
    refused = _outcome(header, path)
    assert refused == _outcome(load, path) and refused[0] == "refused" and words in refused[2]


def test_files_that_are_no_lock_are_refused_alike(tmp_path: Path) -> None:
    (tmp_path / "dir.lock").mkdir()
    os.mkfifo(tmp_path / "fifo.lock")
    (tmp_path / "big.lock").write_bytes(b"#" * (16 * 1024 * 1024 + 1))
    (tmp_path / "bin.lock").write_bytes(b"\xff\xfe\x00")
    for name in ("dir.lock", "fifo.lock", "big.lock", "bin.lock", "missing.lock"):
        assert _outcome(header, tmp_path / name)[0] == "refused"
        _agree(tmp_path / name)


def test_a_resealed_edit_the_models_refuse_is_the_one_disagreement(tmp_path: Path) -> None:
    """A secret-looking variable's value, in clear, sealed by hand: the header verifies the seal,
    the models refuse the value. Recorded here as the one gap the fast paths must not cross."""
    from envlock.lock import read_data

    path = tmp_path / "env.lock"
    make_lock().save(path)
    table = read_data(path)
    table["env"] = {"HF_TOKEN": "hf_" + "a1B2c3D4e5" * 3}
    path.write_text(resealed(table), encoding="utf-8")
    found = header(path)
    assert found.lock is None  # accepted from the table
    assert _outcome(load, path)[0] == "refused"


_EDITS = st.one_of(
    st.tuples(st.just("replace"), st.integers(0, 10**6), st.text(min_size=0, max_size=3)),
    st.tuples(st.just("drop_line"), st.integers(0, 10**6), st.just("")),
    st.tuples(st.just("swap_lines"), st.integers(0, 10**6), st.just("")),
)


def _edited(text: str, edit: tuple[str, int, str]) -> str:
    kind, at, new = edit
    if kind == "replace":
        at %= max(len(text), 1)
        return text[:at] + new + text[at + 1:]
    lines = text.splitlines(keepends=True)
    at %= max(len(lines), 1)
    if kind == "drop_line":
        return "".join(lines[:at] + lines[at + 1:])
    other = (at + 1) % len(lines)
    lines[at], lines[other] = lines[other], lines[at]
    return "".join(lines)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 3), edits=st.lists(_EDITS, min_size=1, max_size=3))
def test_fuzzed_edits_get_the_same_answer_from_both_doors(tmp_path: Path, which: int,
                                                          edits: list[tuple[str, int, str]]) -> None:
    text = dumps(_written_locks()[which])
    for edit in edits:
        text = _edited(text, edit)
    path = tmp_path / "env.lock"
    path.write_text(text, encoding="utf-8")
    _agree(path)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 3), data=st.data())
def test_reordered_or_filled_tables_still_agree(tmp_path: Path, which: int, data: st.DataObject) -> None:
    """Edits that keep the models' form (rows reordered, an empty list written out, a default
    spelt out) keep the seal for load(): the header, whose hash differs, hands them to the models."""
    from envlock.lock import read_data

    path = tmp_path / "env.lock"
    _written_locks()[which].save(path)
    table = read_data(path)
    rows = list(table.get("packages", []))
    table["packages"] = data.draw(st.permutations(rows)) if rows else rows
    flags: list[bool] = data.draw(st.lists(st.booleans(), min_size=2, max_size=2))
    if flags[0]:
        table.setdefault("determinism", {})["process_env"] = []
    if rows and flags[1]:
        table["packages"] = [{**row, "hashes": row.get("hashes", [])} for row in table["packages"]]
    path.write_text(document(table), encoding="utf-8")
    _agree(path)
