"""A lock row with no hash and no record_sha256 cannot prove the file installed for it:
``bundle`` and ``restore`` still work, and say so by name, instead of passing a swapped wheel
in silence."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from helpers import LockFactory

from envlock.commands import main
from envlock.lock import save
from envlock.restore.context import unproven
from envlock.restore.wheelhouse import wheel_record_sha256


def _wheel(directory: Path, name: str, version: str, payload: str) -> Path:
    path = directory / f"{name}-{version}-py3-none-any.whl"
    dist = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}/__init__.py", payload)
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", f"{name}/__init__.py,sha256=x,{len(payload)}\n")
    return path


@pytest.fixture
def trojan(tmp_path: Path) -> Path:
    house = tmp_path / "house"
    house.mkdir()
    _wheel(house, "six", "1.17.0", "import os; os.system('id')\n")  # not the locked build
    return house


def test_bundle_and_restore_name_the_unhashed_rows(restore_lock: LockFactory, trojan: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    lock = save(restore_lock(packages=[("six", "1.17.0")]), tmp_path / "env.lock")
    assert main(["bundle", str(lock), "-o", str(tmp_path / "b"), "--wheelhouse", str(trojan)]) == 0
    err = capsys.readouterr().err
    assert "envlock: warning: nothing in the lock checks the files installed for six 1.17.0" in err, err
    assert main(["restore", str(lock), "--dockerfile-only", str(tmp_path / "ctx"),
                 "--wheelhouse", str(tmp_path / "b"), "--allow-unpinned-base"]) == 0
    err = capsys.readouterr().err
    assert "envlock: warning: nothing in the lock checks the files installed for six 1.17.0" in err, err


def test_a_row_with_a_record_digest_is_checked_and_not_named(restore_lock: LockFactory, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    house = tmp_path / "house"
    house.mkdir()
    good = _wheel(house, "six", "1.17.0", "# six\n")
    row = {"name": "six", "version": "1.17.0", "record_sha256": wheel_record_sha256(good)}
    lock = save(restore_lock(packages=[row]), tmp_path / "env.lock")
    assert main(["bundle", str(lock), "-o", str(tmp_path / "b"), "--wheelhouse", str(house)]) == 0
    assert "warning" not in capsys.readouterr().err
    _wheel(house, "six", "1.17.0", "import os\n")  # the trojan, same name: refused by its RECORD
    assert main(["bundle", str(lock), "-o", str(tmp_path / "c"), "--wheelhouse", str(house)]) == 3


def test_which_rows_are_unproven(restore_lock: LockFactory) -> None:
    lock = restore_lock(packages=[
        ("bare", "1.0"),
        {"name": "hashed", "version": "1.0", "hashes": ["sha256:" + "a" * 64]},
        {"name": "recorded", "version": "1.0", "record_sha256": "b" * 64},
    ])
    assert unproven(lock.packages) == ["bare 1.0"]
