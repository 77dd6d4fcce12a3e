"""Writing a lock never costs the user a file, a permission or a link."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO, make_lock, run_cli

from envlock import lock as lockio
from envlock.errors import UsageError


@pytest.fixture
def umask_077() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def test_a_new_lock_honours_the_umask(tmp_path: Path, umask_077: None) -> None:
    path = lockio.save(make_lock(), tmp_path / "env.lock")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_new_lock_under_the_usual_umask_is_0644(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = lockio.save(make_lock(), tmp_path / "env.lock")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_an_existing_lock_keeps_its_mode(tmp_path: Path, umask_077: None) -> None:
    path = lockio.save(make_lock(), tmp_path / "env.lock")
    path.chmod(0o640)
    lockio.save(make_lock(), path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_a_symlinked_lock_updates_its_target(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    target = lockio.save(make_lock(), shared / "env.lock")
    link = tmp_path / "env.lock"
    link.symlink_to(target)
    lockio.save(make_lock(packages=[{"name": "zzz", "version": "1.0"}]), link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert lockio.load(target).package("zzz") is not None


def test_the_cli_says_it_updated_a_links_target(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    target = lockio.save(make_lock(), shared / "real.lock")
    (tmp_path / "env.lock").symlink_to(target)
    # A hand edit, then fmt through the link.
    target.write_text(target.read_text().replace('version = "2.1.0"', 'version = "2.1.1"'))
    res = run_cli("fmt", "env.lock", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "symbolic link" in res.stderr and str(target) in res.stderr
    assert (tmp_path / "env.lock").is_symlink()
    numpy = lockio.load(target).package("numpy")
    assert numpy is not None and numpy.version == "2.1.1"


def test_temp_files_of_an_interrupted_write_are_removed_on_the_next(tmp_path: Path) -> None:
    path = lockio.save(make_lock(), tmp_path / "env.lock")
    # A writer killed between mkstemp and replace: its process is gone, its temp file stays.
    code = ("import os, sys; sys.path.insert(0, sys.argv[2]); from envlock import lock as lockio\n"
            "def die(*a): os._exit(9)\n"
            "os.replace = die\n"
            "lockio.atomic_write(sys.argv[1], 'partial')\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path), str(REPO)], check=False)
    assert proc.returncode == 9
    leftovers = [p for p in tmp_path.iterdir() if p.name != "env.lock"]
    assert len(leftovers) == 1 and leftovers[0].name.endswith(lockio.TMP_SUFFIX)
    assert lockio.load(path).python.version == "3.11.7"  # never a partial lock
    lockio.save(make_lock(), path)
    assert [p.name for p in tmp_path.iterdir()] == ["env.lock"]


def test_a_temp_file_of_a_write_in_progress_is_kept(tmp_path: Path) -> None:
    live = tmp_path / f".env.lock.{os.getpid()}.abc123{lockio.TMP_SUFFIX}"
    live.write_text("being written")
    other = tmp_path / f".other.lock.99999999.abc{lockio.TMP_SUFFIX}"
    other.write_text("not ours")
    lockio.save(make_lock(), tmp_path / "env.lock")
    assert live.exists() and other.exists()


def test_a_lock_of_a_newer_schema_is_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "env.lock"
    newer = lockio.dumps(make_lock()).replace("schema_version = 1", "schema_version = 7")
    path.write_text(newer)
    with pytest.raises(UsageError, match="schema 7"):
        lockio.save(make_lock(), path)
    assert path.read_text() == newer
    lockio.save(make_lock(), path, force=True)
    assert lockio.load(path).envlock.schema_version == 1


def test_capture_refuses_a_newer_lock_with_exit_2(tmp_path: Path) -> None:
    newer = lockio.dumps(make_lock()).replace("schema_version = 1", "schema_version = 2")
    (tmp_path / "env.lock").write_text(newer)
    res = run_cli("capture", "--no-torch", cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "newer envlock" in res.stderr and "--force" in res.stderr
    assert (tmp_path / "env.lock").read_text() == newer
