"""``pack`` and ``bundle`` rebuild a local package's wheel from the environment the lock was
captured from: a lock made with ``capture --python p/bin/python`` names ``p`` as its prefix, and
without ``--python`` both read ``p``'s installed files (and say so), not envlock's own
environment's. Real parts: a venv, a distribution installed in it as pip leaves one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import LockFactory

from envlock.commands import main
from envlock.probe.packages import record_sha256
from envlock.restore.wheelhouse import read_local_wheels

from test_pack import install_fake, isolated  # isort: skip  # noqa: F401 (a fixture)


def _venv_with_a_local_package(where: Path) -> tuple[Path, Path]:
    """(prefix, dist-info) of a venv holding tinypkg 1.0 as pip installs it from a directory."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=300)
    purelib = subprocess.run([str(where / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    return where, install_fake(Path(purelib), "tinypkg", "1.0")


def _lock_of(restore_lock: LockFactory, prefix: str, dist_info: Path, path: Path) -> Any:
    lock = restore_lock(python={"version": "3.11.2", "implementation": "cpython", "prefix_kind": "venv",
                                "soabi": "cpython-311-x86_64-linux-gnu", "prefix": prefix,
                                "executable": f"{prefix}/bin/python"},
                        packages=[{"name": "tinypkg", "version": "1.0", "source": "local",
                                   "url": "file:///src/tinypkg", "record_sha256": record_sha256(str(dist_info / "RECORD"))}])
    lock.save(path)
    return lock


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated: None) -> tuple[Path, Path]:  # noqa: F811
    """The working directory (no .venv in it or above: nothing else to choose) and the venv."""
    monkeypatch.chdir(tmp_path)
    prefix, dist_info = _venv_with_a_local_package(tmp_path / "p")
    return prefix, dist_info


def test_pack_and_bundle_rebuild_from_the_locks_own_environment_and_say_so(
        restore_lock: LockFactory, project: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    prefix, dist_info = project
    lock_path = tmp_path / "env.lock"
    _lock_of(restore_lock, str(prefix), dist_info, lock_path)
    said = "envlock: rebuilding wheels from the installed files of ./p (the lock's own environment)"

    assert main(["pack", str(lock_path), "-o", "pack", "--no-image", "--no-download"]) == 0
    err = capsys.readouterr().err
    assert said in err.splitlines(), err
    assert json.loads((tmp_path / "pack" / "pack.json").read_text())["rebuilt"] == ["tinypkg"]

    assert main(["bundle", str(lock_path), "-o", "bundle"]) == 0
    err = capsys.readouterr().err
    assert said in err.splitlines(), err
    assert read_local_wheels(tmp_path / "bundle") == {"tinypkg"}
    assert (tmp_path / "bundle" / "tinypkg-1.0-py3-none-any.whl").is_file()


def test_a_lock_whose_environment_is_elsewhere_names_it_in_the_gap(
        restore_lock: LockFactory, project: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    _, dist_info = project
    lock_path = tmp_path / "env.lock"
    _lock_of(restore_lock, "/nonexistent/elsewhere/p", dist_info, lock_path)
    assert main(["pack", str(lock_path), "-o", "pack", "--no-image", "--no-download"]) == 3
    err = capsys.readouterr().err
    assert "tinypkg==1.0 (not installed in the environment" in err
    assert "the lock's own environment /nonexistent/elsewhere/p is not on this machine" in err
    # --python still chooses, over the lock's own.
    assert main(["pack", str(lock_path), "-o", "pack2", "--no-image", "--no-download",
                 "--python", str(tmp_path / "p" / "bin" / "python")]) == 0
