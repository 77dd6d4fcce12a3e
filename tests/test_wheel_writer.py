"""The one wheel writer (``restore/wheelfile``): a wheel rebuilt from installed files keeps each
file's executable bit and is deflated, and the rebuild proves the modes as ``record_sha256``
proves the contents. Real parts: a wheel installed by pip, the rebuilt wheel installed by pip
again, the modes read from the disk."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import LockFactory

from envlock.errors import HashMismatch
from envlock.export.rebuild import rebuild
from envlock.probe.packages import record_sha256

DIST_INFO = "modepkg-1.0.dist-info"


def _original_wheel(directory: Path) -> Path:
    """modepkg 1.0 as a build backend writes it: a module, and an executable helper script
    shipped inside the package (mode 0755 in the zip, as setuptools records it)."""
    from envlock.restore.wheelfile import record_hash

    files = {
        ("modepkg/__init__.py", 0o644): b"VALUE = 1\n",
        ("modepkg/tool.sh", 0o755): b"#!/bin/sh\necho tool\n",
        (f"{DIST_INFO}/METADATA", 0o644): b"Metadata-Version: 2.1\nName: modepkg\nVersion: 1.0\n",
        (f"{DIST_INFO}/WHEEL", 0o644): b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},{record_hash(data)},{len(data)}\n" for (name, _), data in files.items())
    path = directory / "modepkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for (name, mode), data in [*files.items(), ((f"{DIST_INFO}/RECORD", 0o644), (record + f"{DIST_INFO}/RECORD,,\n").encode())]:
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFREG | mode) << 16
            zf.writestr(info, data)
    return path


def _pip_install(wheel: Path, target: Path) -> None:
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
                    "--target", str(target), str(wheel)], check=True, timeout=300, env=env,
                   stdin=subprocess.DEVNULL)


def _executable(path: Path) -> bool:
    return bool(os.stat(path).st_mode & 0o111)


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    """modepkg installed by pip: its site directory (tool.sh executable, __init__.py not)."""
    (tmp_path / "dist").mkdir()
    site = tmp_path / "site"
    _pip_install(_original_wheel(tmp_path / "dist"), site)
    assert _executable(site / "modepkg" / "tool.sh") and not _executable(site / "modepkg" / "__init__.py")
    return site


def _lock(restore_lock: LockFactory, site: Path) -> object:
    return restore_lock(packages=[{"name": "modepkg", "version": "1.0", "source": "local",
                                   "url": "file:///src/modepkg",
                                   "record_sha256": record_sha256(str(site / DIST_INFO / "RECORD"))}])


def test_a_rebuilt_wheel_keeps_the_executable_bit_and_is_deflated(
        restore_lock: LockFactory, installed: Path, tmp_path: Path) -> None:
    lock = _lock(restore_lock, installed)
    out = tmp_path / "out"
    out.mkdir()
    built = rebuild(lock.package("modepkg"), installed / DIST_INFO, out)  # type: ignore[attr-defined]
    with zipfile.ZipFile(built.path) as zf:
        infos = zf.infolist()
    assert {i.compress_type for i in infos} == {zipfile.ZIP_DEFLATED}
    # Installed from the rebuilt wheel, the script is executable again and the module is not.
    again = tmp_path / "again"
    _pip_install(built.path, again)
    assert _executable(again / "modepkg" / "tool.sh")
    assert not _executable(again / "modepkg" / "__init__.py")
    assert (again / "modepkg" / "tool.sh").read_bytes() == (installed / "modepkg" / "tool.sh").read_bytes()


def test_modes_read_back_from_a_wheel_are_compared_with_the_installed_files(
        restore_lock: LockFactory, installed: Path, tmp_path: Path) -> None:
    from envlock.restore.wheelfile import mode_differences

    lock = _lock(restore_lock, installed)
    built = rebuild(lock.package("modepkg"), installed / DIST_INFO, tmp_path)  # type: ignore[attr-defined]
    assert mode_differences(built.path, installed) == []
    (installed / "modepkg" / "tool.sh").chmod(0o644)
    assert mode_differences(built.path, installed) == ["modepkg/tool.sh"]


def test_a_rebuilt_wheel_whose_modes_are_not_the_installed_files_is_refused(
        restore_lock: LockFactory, installed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """record_sha256 cannot see a mode: a file whose mode changed while the wheel was written
    (its contents the lock's) is refused, and no wheel is left behind."""
    from envlock.restore.wheelfile import repack as real

    lock = _lock(restore_lock, installed)

    def repack_then_chmod(dist_info: Path, dest: Path) -> object:
        made = real(dist_info, dest)
        (installed / "modepkg" / "tool.sh").chmod(0o644)
        return made

    monkeypatch.setattr("envlock.export.rebuild.repack", repack_then_chmod)
    with pytest.raises(HashMismatch, match=r"modepkg 1\.0: the rebuilt wheel's file modes .*modepkg/tool\.sh"):
        rebuild(lock.package("modepkg"), installed / DIST_INFO, tmp_path)  # type: ignore[attr-defined]
    assert not list(tmp_path.glob("*.whl"))


def test_envlocks_own_wheel_is_written_by_the_same_writer(tmp_path: Path) -> None:
    """ownwheel packs a pip-built wheel of its source tree again through ``wheelfile.write``:
    an executable entry stays executable there too."""
    from envlock.restore import wheelfile

    members = [wheelfile.Member("pkg/run.sh", b"#!/bin/sh\n", True), wheelfile.Member("pkg/a.py", b"")]
    path = wheelfile.write(tmp_path / "pkg-1-py3-none-any.whl", members, "pkg-1.dist-info")
    with zipfile.ZipFile(path) as zf:
        modes = {i.filename: wheelfile.is_executable(i) for i in zf.infolist()}
        assert zf.read("pkg-1.dist-info/RECORD").decode().splitlines()[-1] == "pkg-1.dist-info/RECORD,,"
    assert modes == {"pkg/a.py": False, "pkg/run.sh": True, "pkg-1.dist-info/RECORD": False}
    again = wheelfile.write(tmp_path / "again.whl", list(reversed(members)), "pkg-1.dist-info")
    assert again.read_bytes() == path.read_bytes()
