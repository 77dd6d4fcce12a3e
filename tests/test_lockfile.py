"""Lock files: round trip, seal, tamper detection, atomic writes, hostile input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import tomllib
from helpers import make_lock

from envlock import lock as lockio
from envlock.errors import EnvlockError, LockInvalid, LockTampered, UsageError
from envlock.lock import Lock


def test_round_trip_is_exact(tmp_path: Path) -> None:
    lock = make_lock()
    path = lockio.save(lock, tmp_path / "env.lock")
    again = lockio.load(path)
    assert again == lockio.seal(lock)
    assert lockio.dumps(again, "env.lock") == path.read_text()


def test_output_is_valid_toml_with_header_and_sorted_packages(tmp_path: Path) -> None:
    lock = make_lock(packages=[{"name": n, "version": "1.0"} for n in ("zeta", "alpha", "mid")])
    text = lockio.dumps(lockio.seal(lock))
    assert text.startswith("# env.lock")
    assert "envlock verify" in text.splitlines()[1]
    data = tomllib.loads(text)
    assert [p["name"] for p in data["packages"]] == ["alpha", "mid", "zeta"]


def test_tricky_strings_survive(tmp_path: Path) -> None:
    note = 'quote " backslash \\ newline \n tab \t unicode é 漢 \u0007'
    lock = make_lock(env={"NCCL_DEBUG": "INFO", "TORCH_X": "a\"b\\c"})
    lock = lock.model_copy(update={"envlock": lock.envlock.model_copy(update={"note": note})})
    path = lockio.save(lock, tmp_path / "env.lock")
    again = lockio.load(path)
    assert again.envlock.note == note and again.env["TORCH_X"] == 'a"b\\c'


def test_fingerprint_ignores_host_specific_values() -> None:
    a = make_lock()
    b = make_lock(platform={**a.platform.model_dump(exclude_none=True), "kernel": "6.1", "cpu_count": 96},
                  python={**a.python.model_dump(exclude_none=True), "executable": "/other/bin/python"},
                  git={"commit": "f" * 40, "dirty": True})
    assert lockio.fingerprint(a) == lockio.fingerprint(b)
    assert lockio.integrity(a) != lockio.integrity(b)
    c = make_lock(packages=[{"name": "numpy", "version": "2.1.1"}])
    assert lockio.fingerprint(a) != lockio.fingerprint(c)


def test_hand_edit_is_detected_and_fmt_reseals(tmp_path: Path) -> None:
    path = lockio.save(make_lock(), tmp_path / "env.lock")
    path.write_text(path.read_text().replace('version = "2.1.0"', 'version = "2.1.1"'))
    with pytest.raises(LockTampered, match="edited after capture"):
        lockio.load(path)
    lock = lockio.load(path, verify_seal=False)
    numpy = lock.package("numpy")
    assert numpy is not None and numpy.version == "2.1.1"
    lockio.save(lock, path)
    assert lockio.load(path).package("numpy") == numpy


def test_edit_outside_fingerprint_is_still_detected(tmp_path: Path) -> None:
    path = lockio.save(make_lock(git={"commit": "a" * 40}), tmp_path / "env.lock")
    path.write_text(path.read_text().replace("a" * 40, "b" * 40))
    with pytest.raises(LockTampered):
        lockio.load(path)


def test_unsealed_lock_is_rejected(tmp_path: Path) -> None:
    lock = make_lock()
    bare = lock.model_copy(update={"envlock": lock.envlock.model_copy(update={"fingerprint": None, "integrity": None})})
    path = tmp_path / "env.lock"
    path.write_text(lockio.dumps(bare))
    with pytest.raises(LockTampered, match="not sealed"):
        lockio.load(path)


def test_refuses_to_overwrite_a_foreign_file(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('my precious experiment')\n")
    with pytest.raises(UsageError, match=r"not an env\.lock"):
        lockio.save(make_lock(), script)
    assert script.read_text() == "print('my precious experiment')\n"
    lockio.save(make_lock(), script, force=True)
    assert lockio.load(script).python.version == "3.11.7"


def test_atomic_write_keeps_old_file_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = lockio.save(make_lock(), tmp_path / "env.lock")
    before = path.read_text()

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(EnvlockError, match="disk full"):
        lockio.save(make_lock(packages=[]), path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["env.lock"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[envlock\nschema_version = 1", "not valid TOML"),
        (b"\x00\x01\x02binary\xff" * 100, "binary file"),
        (b"\xff\xfe\xfa not utf8", "not UTF-8"),
        (b'title = "not a lock"\n', "no [envlock] table"),
        (b"[envlock]\nschema_version = 99\n", "schema 99"),
        (b"[envlock]\nschema_version = 0\n", "lock schema 0, which no envlock wrote"),
    ],
)
def test_bad_input_gives_one_clear_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "env.lock"
    path.write_bytes(content)
    with pytest.raises(LockInvalid, match=message.replace("[", r"\[")):
        lockio.load(path)


def test_unknown_key_and_wrong_type(tmp_path: Path) -> None:
    data = json.loads(json.dumps(make_lock().model_dump(mode="json", exclude_none=True)))
    data["python"]["flavour"] = "spicy"
    with pytest.raises(LockInvalid, match=r"unknown key 'flavour' in \[python\]"):
        lockio.from_dict(data)
    data["python"].pop("flavour")
    data["packages"][0]["version"] = 3
    with pytest.raises(LockInvalid, match=r"packages\.0\.version"):
        lockio.from_dict(data)


def test_huge_file_is_refused_without_reading(tmp_path: Path) -> None:
    path = tmp_path / "env.lock"
    with open(path, "wb") as fh:
        fh.truncate(50 * 1024 * 1024)
    with pytest.raises(LockInvalid, match="at most 16 MiB"):
        lockio.load(path)


def test_credentials_in_urls_are_refused_by_the_model() -> None:
    with pytest.raises(ValueError, match="credentials"):
        Lock.model_validate({**make_lock().model_dump(mode="json", exclude_none=True),
                             "git": {"remote": "https://u:p@github.com/o/r"}})
