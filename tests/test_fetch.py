"""``bundle`` and ``pack`` take every wheel already on disk (find-links, pip's wheel and HTTP
caches, uv's cache) and download only the rest, each file proven before it is kept."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import pytest
from export_index import layout, serve
from helpers import LockFactory

from envlock.commands import main
from envlock.errors import EnvlockError
from envlock.export.bundle import bundle
from envlock.probe.packages import record_sha256

from test_pack import install_fake  # isort: skip
from test_restore_run_bundle import make_wheel  # isort: skip

UNREACHABLE = "http://127.0.0.1:9/simple/"  # nothing listens on port 9


def _sha(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_wheel_pip_downloaded_before_is_taken_from_its_http_cache(
        installer_clean: Path, tmp_path: Path, restore_lock: LockFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", UNREACHABLE)
    src = make_wheel(tmp_path, "alpha", "1.0", tag="cp311-cp311-manylinux_2_17_x86_64")
    body = Path(os.environ["PIP_CACHE_DIR"]) / "http-v2" / "a" / "b" / "0123abcd.body"
    body.parent.mkdir(parents=True)
    shutil.copyfile(src, body)
    (body.parent / "0123abcd").write_bytes(b"\x00headers")  # the response's metadata, not a wheel
    (body.parent / "4567.body").write_bytes(b'{"files": []}')  # a cached index page
    lock = restore_lock(packages=[{"name": "alpha", "version": "1.0", "hashes": [_sha(src)]}])
    result = bundle(lock, tmp_path / "out")
    assert dict(result.origins) == {"alpha": "pip http cache"}
    assert [f[2] for f in result.files] == [src.name]
    assert (tmp_path / "out" / src.name).read_bytes() == src.read_bytes()


def test_a_wheel_only_in_uvs_cache_is_rebuilt_from_it_and_proven(
        installer_clean: Path, tmp_path: Path, restore_lock: LockFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", UNREACHABLE)
    archive = Path(os.environ["UV_CACHE_DIR"]) / "archive-v0" / "Xy_12abc"
    archive.mkdir(parents=True)
    dist = install_fake(archive, "h20-demo", "0.3.1")
    good = record_sha256(str(dist / "RECORD"))
    lock = restore_lock(packages=[{"name": "h20-demo", "version": "0.3.1", "record_sha256": good}])
    result = bundle(lock, tmp_path / "out")
    assert dict(result.origins) == {"h20-demo": "uv cache"}
    # Another build in the cache is never taken for the lock's.
    other = restore_lock(packages=[{"name": "h20-demo", "version": "0.3.1", "record_sha256": "f" * 64}])
    with pytest.raises(EnvlockError, match=r"h20-demo==0\.3\.1") as exc:
        bundle(other, tmp_path / "out2")
    assert "uv cache" in exc.value.message and "not the lock's build" in exc.value.message


def test_find_links_and_the_index_together_download_only_what_is_missing(
        installer_clean: Path, tmp_path: Path, restore_lock: LockFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    local = tmp_path / "local"
    local.mkdir()
    make_wheel(local, "alpha", "1.0")
    remote = tmp_path / "remote"
    remote.mkdir()
    for name in ("alpha", "beta", "gamma", "delta"):
        make_wheel(remote, name, "1.0")
    monkeypatch.setenv("PIP_FIND_LINKS", str(local))
    lock = restore_lock(packages=[(n, "1.0") for n in ("alpha", "beta", "gamma", "delta")])
    with serve(layout(remote, tmp_path / "www")) as url:
        monkeypatch.setenv("UV_DEFAULT_INDEX", url + "/simple/")
        result = bundle(lock, tmp_path / "out", workers=2)
    assert dict(result.origins) == {"alpha": "find-links", "beta": "index", "delta": "index", "gamma": "index"}
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]


def test_a_download_that_is_not_what_the_index_or_the_lock_says_never_lands(
        installer_clean: Path, tmp_path: Path, restore_lock: LockFactory, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    alpha = make_wheel(remote, "alpha", "1.0")
    beta = make_wheel(remote, "beta", "1.0")
    root = layout(remote, tmp_path / "www")
    alpha.write_bytes(alpha.read_bytes() + b"tampered after listing")
    lock = restore_lock(packages=[("alpha", "1.0"), {"name": "beta", "version": "1.0",
                                                      "hashes": ["sha256:" + "0" * 64]}])
    path = tmp_path / "env.lock"
    lock.save(path)
    with serve(root) as url:
        monkeypatch.setenv("PIP_INDEX_URL", url + "/simple/")
        assert main(["bundle", str(path), "-o", str(tmp_path / "out"), "--allow-http"]) == 3
    err = capsys.readouterr().err
    assert "alpha==1.0" in err and "does not have the sha256 its index lists" in err
    assert "beta==1.0" in err and "not a file the lock's hashes allow" in err
    assert "Traceback" not in err
    assert not list((tmp_path / "out").glob("*.whl"))
    assert beta.exists()


def test_plain_http_to_another_host_needs_allow_http(
        installer_clean: Path, tmp_path: Path, restore_lock: LockFactory, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "http://mirror.example/simple/")
    path = tmp_path / "env.lock"
    restore_lock(packages=[("alpha", "1.0")]).save(path)
    assert main(["bundle", str(path), "-o", str(tmp_path / "out")]) == 2
    assert "--allow-http" in capsys.readouterr().err


@pytest.mark.slow
def test_the_bundle_benchmark_runs(tmp_path: Path) -> None:
    import subprocess

    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "bundle.py"
    proc = subprocess.run([sys.executable, str(bench), "--wheels", "6", "--missing", "3", "--repeat", "1",
                           "--size-kb", "64"], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "envlock bundle" in proc.stdout


def test_a_package_installed_from_a_url_is_downloaded_from_it_and_checked(
        installer_clean: Path, tmp_path: Path, restore_lock: LockFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    whl = make_wheel(remote, "alpha", "1.0")
    monkeypatch.setenv("PIP_INDEX_URL", UNREACHABLE)
    with serve(layout(remote, tmp_path / "www")) as url:
        row = {"name": "alpha", "version": "1.0", "source": "url", "url": f"{url}/files/{whl.name}",
               "archive_hash": "sha256=" + _sha(whl)[7:]}
        result = bundle(restore_lock(packages=[row]), tmp_path / "out", allow_http=True)
        assert dict(result.origins) == {"alpha": "index"}
        bad = {**row, "archive_hash": "sha256=" + "0" * 64}
        with pytest.raises(EnvlockError, match="not a file the lock's hashes allow"):
            bundle(restore_lock(packages=[bad]), tmp_path / "out2", allow_http=True)
