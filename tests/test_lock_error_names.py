"""A schema error in a lock row names the row's package, not only its index in the list
(``fmt`` after an edit said ``packages.14.version``, leaving the user to count)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import make_lock

from envlock.commands import main
from envlock.errors import LockInvalid
from envlock.lock import from_dict, save


def test_fmt_names_the_package_with_the_bad_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lock = save(make_lock(packages=[("aaa", "1.0"), ("torch", "2.5.0"), ("zzz", "3.0")]), tmp_path / "env.lock")
    text = lock.read_text()
    assert text.count('version = "2.5.0"') == 1
    lock.write_text(text.replace('version = "2.5.0"', 'version = "2.5.0 beta$(id)"'))
    assert main(["fmt", str(lock)]) == 2
    err = capsys.readouterr().err
    assert "packages.1.version (package torch):" in err, err


def test_a_hostile_name_is_escaped_and_a_nameless_row_keeps_its_index() -> None:
    data = make_lock(packages=[("x", "1.0")]).model_dump(mode="json", exclude_none=True)
    data["packages"][0]["version"] = "not a version!"
    data["packages"][0]["name"] = "x\n\x1b[2Jevil"
    with pytest.raises(LockInvalid) as info:
        from_dict(data, verify_seal=False)
    assert "\n" not in info.value.message and "\x1b" not in info.value.message
    data["packages"][0]["name"] = 7
    with pytest.raises(LockInvalid, match=r"packages\.0\.") as info:
        from_dict(data, verify_seal=False)
    assert "(package" not in info.value.message


def test_an_unknown_key_is_named_before_what_it_left_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A misspelt key said "envlock.tool_version: Field required (and 1 more)": the key to fix
    was the one more. The unknown key comes first, with its table and the key it was meant to be."""
    lock = save(make_lock(packages=[("aaa", "1.0"), ("torch", "2.5.0")]), tmp_path / "env.lock")
    text = lock.read_text()
    lock.write_text(text.replace("\ntool_version = ", "\ntool_versoin = ", 1))
    assert main(["fmt", str(lock)]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'tool_versoin' in [envlock]; did you mean 'tool_version'? (and 1 more)" in err, err
    assert "Field required" not in err
    # in a row: the table as the file writes it, and the package
    data = make_lock(packages=[("aaa", "1.0"), ("torch", "2.5.0")]).model_dump(mode="json", exclude_none=True)
    data["packages"][1]["colour\x1b[2J"] = "red"
    with pytest.raises(LockInvalid) as info:
        from_dict(data, verify_seal=False)
    assert info.value.message.endswith("unknown key 'colour\\x1b[2J' in [[packages]] (package torch)")


def test_twin_a_missing_key_alone_is_still_named_as_missing() -> None:
    data = make_lock().model_dump(mode="json", exclude_none=True)
    del data["envlock"]["tool_version"]
    with pytest.raises(LockInvalid, match=r"envlock\.tool_version: Field required$"):
        from_dict(data, verify_seal=False)
