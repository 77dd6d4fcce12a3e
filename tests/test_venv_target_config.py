"""``restore --target venv`` installs the wheels it checked and nothing else, whatever pip's and
uv's configuration on this host says, as the image target does (its builds run uv with
``--no-config`` inside an image that has none of the host's settings). Real parts: a venv, pip
or uv installing into it, a find-links directory configured in each way the installers read."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from helpers import LockFactory

from envlock.restore.image import Options
from envlock.restore.venvtarget import restore_venv
from envlock.restore.wheelfile import Member, write
from envlock.restore.wheelhouse import wheel_record_sha256

HERE = f"{sys.version_info.major}.{sys.version_info.minor}"


def _wheel(directory: Path, tag: str, who: str) -> Path:
    directory.mkdir(exist_ok=True)
    info = "tinypkg-1.0.dist-info"
    members = [Member("tinypkg/__init__.py", f"WHO = {who!r}\n".encode()),
               Member(f"{info}/METADATA", b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n"),
               Member(f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n".encode())]
    return write(directory / f"tinypkg-1.0-{tag}.whl", members, info)


def _uv() -> str:
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail("uv is not installed; scripts/test.sh installs it with the dev dependencies", pytrace=False)
    return found


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_the_installers_configuration_adds_no_place_to_take_a_wheel_from(
        installer: str, restore_lock: LockFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pack = _wheel(tmp_path / "wheels", "py3-none-any", "the pack")
    # A better-fitting wheel of the same version elsewhere: an installer that looks there takes it.
    elsewhere = tmp_path / "elsewhere"
    _wheel(elsewhere, f"cp{HERE.replace('.', '')}-none-any", "elsewhere")
    pip_conf = tmp_path / "pip.conf"
    pip_conf.write_text(f"[global]\nfind-links = {elsewhere}\n[install]\nfind-links = {elsewhere}\n")
    uv_toml = tmp_path / "uv.toml"
    uv_toml.write_text(f'find-links = ["{elsewhere}"]\n')
    monkeypatch.setenv("PIP_CONFIG_FILE", str(pip_conf))
    monkeypatch.setenv("PIP_FIND_LINKS", str(elsewhere))
    monkeypatch.setenv("UV_FIND_LINKS", str(elsewhere))
    monkeypatch.setenv("UV_CONFIG_FILE", str(uv_toml))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if installer == "uv":
        (bin_dir / "uv").symlink_to(_uv())
    monkeypatch.setenv("PATH", str(bin_dir))  # uv on PATH or not: that picks the installer

    lock = restore_lock(python={"version": f"{HERE}.0", "implementation": "cpython", "prefix_kind": "venv",
                                "prefix": "/opt/venv"},
                        packages=[{"name": "tinypkg", "version": "1.0", "record_sha256": wheel_record_sha256(pack)}])
    dest = tmp_path / "venv"
    result = restore_venv(lock, pack.parent, dest, Options(python=sys.executable), verify=False)
    assert result.installer == installer
    (init,) = dest.glob("lib/python*/site-packages/tinypkg/__init__.py")
    assert init.read_text() == "WHO = 'the pack'\n"
    assert os.environ["UV_FIND_LINKS"] == str(elsewhere)  # the user's settings are theirs, untouched
