"""Restore proves the build: wheels are checked against the lock before they are installed."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from helpers import LockFactory

from envlock.drift.compare import compare
from envlock.drift.expected import _restore_severity
from envlock.errors import BadWheel, HashMismatch, PlainHttp, UnsafeValue, UsageError
from envlock.export.bundle import bundle
from envlock.lock import Lock
from envlock.probe.packages import record_sha256
from envlock.probe.scrub import strip_url
from envlock.restore import context as ctx
from envlock.restore import dockerfile
from envlock.restore.image import Options
from envlock.restore.restore import prepare
from envlock.restore.wheelhouse import wheel_record_sha256

DIGEST = "sha256:" + "ab" * 32


def _entry(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(directory: Path, name: str, version: str, *, flavour: str = "a") -> Path:
    """A real wheel: a package, purelib and scripts under .data, and a RECORD that lists them."""
    stem = f"{name}-{version}"
    files = {
        f"{name}/__init__.py": f"FLAVOUR = {flavour!r}\n".encode(),
        f"{stem}.data/purelib/{name}_extra.py": b"x = 1\n",
        f"{stem}.data/scripts/{name}-tool": b"#!python\nprint('hi')\n",
        f"{stem}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{stem}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [_entry(k, v) for k, v in files.items()] + [f"{stem}.dist-info/RECORD,,"]
    path = directory / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for k, v in files.items():
            zf.writestr(k, v)
        zf.writestr(f"{stem}.dist-info/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture
def house(tmp_path: Path) -> Path:
    d = tmp_path / "house"
    d.mkdir()
    build_wheel(d, "alpha", "1.0")
    build_wheel(d, "beta", "2.0")
    return d


def _lock(restore_lock: LockFactory, house: Path, **overrides: Any) -> Lock:
    pkgs = []
    for name, version in (("alpha", "1.0"), ("beta", "2.0")):
        row = {"name": name, "version": version,
               "record_sha256": wheel_record_sha256(house / f"{name}-{version}-py3-none-any.whl")}
        row.update(overrides.get(name, {}))
        pkgs.append(row)
    return restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=pkgs)


def test_a_wheels_record_gives_the_installed_record_sha256(tmp_path: Path, house: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                    "--quiet", "--no-index", "--no-deps", "--disable-pip-version-check",
                    str(house / "alpha-1.0-py3-none-any.whl")], check=True)
    (dist,) = venv.glob("lib/python*/site-packages/alpha-1.0.dist-info")
    installed = (dist / "RECORD").read_text()
    assert "../../../bin/alpha-tool" in installed and "INSTALLER" in installed  # pip moved things
    assert record_sha256(str(dist / "RECORD")) == wheel_record_sha256(house / "alpha-1.0-py3-none-any.whl")


def test_bundle_refuses_another_build_naming_the_package(restore_lock: LockFactory, house: Path,
                                                         tmp_path: Path) -> None:
    lock = _lock(restore_lock, house)
    other = tmp_path / "other"
    other.mkdir()
    build_wheel(other, "alpha", "1.0", flavour="patched")
    build_wheel(other, "beta", "2.0")
    with pytest.raises(HashMismatch, match=r"alpha 1\.0: .* another build") as exc:
        bundle(lock, tmp_path / "out", source=other)
    assert exc.value.exit_code == 3
    assert len(bundle(lock, tmp_path / "out", source=house).files) == 2


def test_a_non_zip_wheel_is_refused(restore_lock: LockFactory, house: Path, tmp_path: Path) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=[("alpha", "1.0")])
    (house / "alpha-1.0-py3-none-any.whl").write_text("#!/bin/sh\necho owned\n")
    with pytest.raises(BadWheel, match="not a zip"):
        bundle(lock, tmp_path / "out", source=house)


def test_offline_restore_checks_every_wheel_before_the_build(restore_lock: LockFactory, house: Path,
                                                            tmp_path: Path) -> None:
    lock = _lock(restore_lock, house)
    prepare(lock, Options(wheelhouse=house))  # the right builds pass
    build_wheel(house, "beta", "2.0", flavour="swapped")
    with pytest.raises(HashMismatch, match=r"beta 2\.0"):
        prepare(lock, Options(wheelhouse=house))


def test_an_md5_archive_hash_is_kept_checked_and_said(restore_lock: LockFactory, house: Path, tmp_path: Path) -> None:
    wheel = house / "alpha-1.0-py3-none-any.whl"
    md5 = hashlib.md5(wheel.read_bytes()).hexdigest()
    lock = _lock(restore_lock, house, alpha={"source": "url", "url": "https://files.example/alpha.whl",
                                             "archive_hash": f"md5={md5}"})
    assert len(bundle(lock, tmp_path / "out", source=house).files) == 2
    plan = ctx.plan(lock, Options())
    assert any("md5" in n and "pip cannot check" in n for n in plan.notes)
    bad = _lock(restore_lock, house, alpha={"source": "url", "url": "https://files.example/alpha.whl",
                                            "archive_hash": "md5=" + "0" * 32})
    with pytest.raises(HashMismatch, match=r"alpha 1\.0"):
        bundle(bad, tmp_path / "out2", source=house)


def test_plain_http_needs_an_explicit_opt_in(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST},
                        packages=[{"name": "alpha", "version": "1.0", "source": "url",
                                   "url": "http://files.example/alpha-1.0-py3-none-any.whl"}])
    with pytest.raises(PlainHttp, match="plain http") as exc:
        ctx.plan(lock, Options())
    assert "--allow-http" in (exc.value.hint or "")
    assert "alpha @ http://" in dockerfile.render(ctx.plan(lock, Options(allow_http=True)))[
        "requirements/packages.txt"]
    plain = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=[("alpha", "1.0")])
    with pytest.raises(PlainHttp):
        ctx.plan(plain, Options(index_url="http://mirror.example/simple"))


def test_cli_refuses_http_with_exit_2(restore_lock: LockFactory, tmp_path: Path) -> None:
    from envlock.commands import main
    from envlock.lock import save

    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=[("alpha", "1.0")])
    path = save(lock, tmp_path / "env.lock")
    args = ["restore", str(path), "--dockerfile-only", str(tmp_path / "ctx"),
            "--index-url", "http://mirror.example/simple"]
    assert main(args) == 2
    assert main([*args, "--allow-http"]) == 0


@pytest.mark.parametrize("venv", ["/usr", "/usr/local", "/root", "/usr/local/"])
def test_a_system_directory_is_not_a_venv(restore_lock: LockFactory, venv: str) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST})
    with pytest.raises(UnsafeValue, match="system or shared directory"):
        ctx.plan(lock, Options(venv=venv))
    ctx.plan(lock, Options(venv="/usr/local/venv"))  # below them is fine


def test_an_ssh_url_keeps_its_user(restore_lock: LockFactory) -> None:
    url = "ssh://git@github.com/lab/tool.git"
    assert strip_url(url) == url
    assert strip_url("ssh://git:hunter2@github.com/lab/tool.git") == "ssh://github.com/lab/tool.git"
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST},
                        packages=[{"name": "tool", "version": "1.0", "source": "vcs", "vcs": "git",
                                   "url": url, "commit": "c" * 40}])
    req = dockerfile.render(ctx.plan(lock, Options()))["requirements/packages.txt"]
    assert f"tool @ git+{url}@{'c' * 40}" in req


def test_wheelhouse_links_never_leave_the_wheelhouse(restore_lock: LockFactory, house: Path, tmp_path: Path) -> None:
    secret = tmp_path / "id_ed25519"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (house / "alpha-1.0-py3-none-any.whl").unlink()
    (house / "alpha-1.0-py3-none-any.whl").symlink_to(secret)
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST}, packages=[("alpha", "1.0")])
    with pytest.raises(UsageError, match="outside the wheelhouse"):
        bundle(lock, tmp_path / "out", source=house)
    assert not any("PRIVATE" in p.read_text(errors="replace") for p in (tmp_path / "out").rglob("*")
                   if p.is_file())
    with pytest.raises(UsageError, match="outside the wheelhouse"):
        prepare(lock, Options(wheelhouse=house))
    # A link that stays inside the wheelhouse is fine.
    (house / "alpha-1.0-py3-none-any.whl").unlink()
    (house / "store").mkdir()
    real = build_wheel(house / "store", "alpha", "1.0")
    (house / "alpha-1.0-py3-none-any.whl").symlink_to(real)
    assert len(bundle(lock, tmp_path / "out3", source=house).files) == 1


def test_a_different_build_fails_a_restore_but_only_warns_in_verify(restore_lock: LockFactory, house: Path) -> None:
    lock = _lock(restore_lock, house, alpha={}, beta={})
    rebuilt = lock.model_copy(update={"packages": [
        p.model_copy(update={"record_sha256": "f" * 64}) for p in lock.packages]})
    plain = compare(lock, rebuilt)
    assert plain.ok and {d.severity for d in plain.differences} == {"warning"}
    inside = [_restore_severity(d) for d in plain.differences]
    assert {d.severity for d in inside} == {"breaking"}
    assert any("alpha" in d.describe() and "another build" in d.describe() for d in inside)


def test_another_build_of_pip_only_warns_in_a_restore(restore_lock: LockFactory) -> None:
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST},
                        packages=[{"name": "pip", "version": "24.0", "record_sha256": "0" * 64}])
    rebuilt = lock.model_copy(update={"packages": [lock.packages[0].model_copy(update={"record_sha256": "1" * 64})]})
    (d,) = compare(lock, rebuilt).differences
    assert _restore_severity(d).severity == "warning"


def test_a_deeply_nested_manifest_is_a_usage_error(tmp_path: Path) -> None:
    from envlock.restore.wheelhouse import MANIFEST, read_manifest

    (tmp_path / MANIFEST).write_text('{"files": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(UsageError, match="not a valid bundle manifest"):
        read_manifest(tmp_path)


def test_offline_restore_names_every_missing_wheel_before_the_build(restore_lock: LockFactory, house: Path) -> None:
    from envlock.errors import NotRestorable

    lock = _lock(restore_lock, house)
    pkgs = [*lock.packages, lock.packages[0].model_copy(update={"name": "gamma", "version": "3.0"})]
    lock = lock.model_copy(update={"packages": [
        p.model_copy(update={"version": "9.9.9"}) if p.name == "beta" else p for p in pkgs]})
    with pytest.raises(NotRestorable, match=r"no wheel in the wheelhouse .* for: beta==9\.9\.9, gamma==3\.0") as exc:
        prepare(lock, Options(wheelhouse=house))
    assert exc.value.exit_code == 3 and "envlock bundle" in (exc.value.hint or "")


def test_offline_tooling_without_a_wheel_keeps_the_bases_and_is_info(restore_lock: LockFactory, house: Path) -> None:
    from envlock.drift.expected import Restored, allow

    build_wheel(house, "setuptools", "65.5.0")
    lock = _lock(restore_lock, house)
    setuptools = {"name": "setuptools", "version": "65.5.0",
                  "record_sha256": wheel_record_sha256(house / "setuptools-65.5.0-py3-none-any.whl")}
    lock = restore_lock(image={"reference": "a/b", "digest": DIGEST},
                        packages=[*(p.model_dump() for p in lock.packages),
                                  {"name": "pip", "version": "23.2.1"}, setuptools])
    plan, files = prepare(lock, Options(wheelhouse=house))
    assert plan.base_tooling == ("pip",)
    assert any(n.startswith("pip==23.2.1: no wheel in the wheelhouse") for n in plan.notes)
    assert "pip==" not in files["requirements/tooling.txt"]
    assert "setuptools==65.5.0" in files["requirements/tooling.txt"]  # the one it has is pinned
    assert "pip" not in plan.remove  # the base's pip stays, it is not uninstalled
    inside = lock.model_copy(update={"packages": [
        p.model_copy(update={"version": "23.0.1"}) if p.name in ("pip", "alpha") else p for p in lock.packages]})
    shown = allow(compare(lock, inside), Restored("sha256:x", base_tooling=plan.base_tooling), lock)
    sev = {d.path: d.severity for d in shown.differences}
    assert sev["packages.pip.version"] == "info"
    assert sev["packages.alpha.version"] == "breaking"  # the experiment's packages still count
