"""conda environments: capture with hashes, verify and diff, on a prefix of hand-built packages
(tests/condapkgs.py) installed by py-rattler."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import make_lock, run_cli

from envlock.drift.compare import compare
from envlock.lock import load
from envlock.probe import packages


def _capture(prefix: Path, out: Path) -> dict[str, Any]:
    res = run_cli("capture", "--python", str(prefix / "bin" / "python"), "--no-torch", "-o", str(out),
                  cwd=out.parent)
    assert res.returncode == 0, res.stderr
    return load(out).model_dump(mode="json", exclude_none=True)


def _copy_prefix(conda_channel: Any, tmp_path: Path) -> Path:
    """A prefix of its own for a test that changes it (the session's is shared). Its files
    still name the original prefix, which no capture reads."""
    prefix = tmp_path / "env"
    shutil.copytree(conda_channel.prefix, prefix, symlinks=True)
    return prefix


@pytest.mark.slow
def test_an_unchanged_conda_env_verifies(conda_channel: Any, tmp_path: Path) -> None:
    """Every conda record with its archive's identity; the noarch python package conda installed
    is a package of source "conda" (once [[unreadable]]: verify exited 1 on every conda env)."""
    lock = _capture(conda_channel.prefix, tmp_path / "env.lock")
    assert not lock.get("unreadable"), lock["unreadable"]
    conda = {p["name"]: p for p in lock["conda"]["packages"]}
    assert sorted(conda) == ["foodata", "foopy", "footool", "libfoo", "python"]
    built = {b.name: b for b in conda_channel.packages}
    for name, pkg in conda.items():
        meta = json.loads(next((conda_channel.prefix / "conda-meta").glob(f"{name}-*.json")).read_text())
        assert pkg["sha256"] == meta["sha256"] == packages_sha256(built[name].path)
        assert pkg["md5"] == meta["md5"] and pkg["size"] == built[name].path.stat().st_size
        assert pkg["fn"] == built[name].path.name and pkg["url"] == built[name].path.as_uri()
        assert pkg["subdir"] == built[name].path.parent.name and pkg["build_number"] == 0
    assert conda["footool"]["depends"] == ["libfoo 1.0.*"] and conda["footool"]["requested_specs"] == ["footool"]
    assert conda["foopy"]["noarch"] == "python" and "requested_specs" not in conda["libfoo"]
    foopy = next(p for p in lock["packages"] if p["name"] == "foopy")
    assert foopy["source"] == "conda" and foopy["installer"] == "conda"
    virtual = {v["name"]: v for v in lock["conda"]["virtual_packages"]}
    assert {"__unix", "__linux", "__glibc", "__archspec"} <= set(virtual)
    res = run_cli("verify", "--python", str(conda_channel.prefix / "bin" / "python"), "env.lock",
                  cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    shown = run_cli("show", "env.lock", cwd=tmp_path).stdout
    assert "conda         5 packages (linux-64, noarch)" in shown, shown


def packages_sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_rebuilt_conda_package_is_drift(conda_channel: Any, tmp_path: Path) -> None:
    """The same name, version and build from another archive is another binary: verify exits
    1 and names the package (it was a warning printing ``channel//h0_0``)."""
    prefix = _copy_prefix(conda_channel, tmp_path)
    _capture(prefix, tmp_path / "env.lock")
    record = next((prefix / "conda-meta").glob("libfoo-*.json"))
    meta = json.loads(record.read_text())
    meta["sha256"] = "0" * 64
    record.write_text(json.dumps(meta))
    res = run_cli("verify", "--python", str(prefix / "bin" / "python"), "env.lock", cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "libfoo 1.0 h0_0: same version and build, another archive" in res.stdout


def _conda_lock(**pkg: Any) -> Any:
    base = {"name": "libfoo", "version": "1.0", "build": "h0_0", "channel": "file:///c/"}
    return make_lock(conda={"packages": [{**base, **pkg}]})


def test_conda_differences_and_their_weight() -> None:
    """Build string and archive hash are breaking; the channel alone is a warning without
    hashes to tell the archives apart and info for the same archive; no ``channel//build``."""
    a = _conda_lock(sha256="a" * 64)
    for changed, path, severity in (
            (_conda_lock(sha256="b" * 64), "conda.libfoo.sha256", "breaking"),
            (_conda_lock(build="h1_0", sha256="a" * 64), "conda.libfoo.build", "breaking"),
            (_conda_lock(channel="file:///d/", sha256="a" * 64), "conda.libfoo.channel", "info")):
        [diff] = compare(a, changed).differences
        assert (diff.path, diff.severity) == (path, severity)
        assert "//" not in diff.message.replace("file:///", "")
    [diff] = compare(_conda_lock(), _conda_lock(channel="file:///d/")).differences
    assert diff.severity == "warning"


def test_conda_record_fields() -> None:
    """conda's own spelling (requested_spec, the old noarch table, credentials in the url) is
    read into the lock's; a value of the wrong type is left out rather than failing the
    record."""
    entry = packages.conda_record({
        "name": "numpy", "version": "1.26.4", "build": "py311_0", "build_number": "7",
        "channel": "https://user:pw@conda.example/main", "subdir": "linux-64",
        "url": "https://user:pw@conda.example/main/linux-64/numpy-1.26.4-py311_0.conda",
        "md5": "c" * 32, "sha256": "d" * 64, "size": 10, "depends": ["python >=3.11"],
        "noarch": {"type": "python"}, "requested_spec": "numpy=1.26"})
    assert entry == {
        "name": "numpy", "version": "1.26.4", "build": "py311_0", "channel": "https://conda.example/main",
        "subdir": "linux-64", "fn": "numpy-1.26.4-py311_0.conda",
        "url": "https://conda.example/main/linux-64/numpy-1.26.4-py311_0.conda", "md5": "c" * 32,
        "sha256": "d" * 64, "size": 10, "depends": ["python >=3.11"], "noarch": "python",
        "requested_specs": ["numpy=1.26"]}


def test_archspec_levels() -> None:
    v3 = ["cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3", "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"]
    assert packages.archspec("x86_64", v3) == "x86_64_v3"
    assert packages.archspec("x86_64", v3[:6]) == "x86_64_v2"
    assert packages.archspec("x86_64", []) == "x86_64"
    assert packages.archspec("aarch64", None) == "aarch64"


@pytest.mark.slow
def test_verify_deep_checks_conda_files(conda_channel: Any, tmp_path: Path) -> None:
    """``verify --deep`` hashes every file a conda record lists: a text file whose placeholder
    the installer replaced against ``sha256_in_prefix``, a binary against the archive's
    ``sha256``; an unchanged prefix passes, an edited or removed file is named."""
    prefix = _copy_prefix(conda_channel, tmp_path)
    python = str(prefix / "bin" / "python")
    _capture(prefix, tmp_path / "env.lock")
    res = run_cli("verify", "--deep", "--python", python, "env.lock", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    config = prefix / "bin" / "foo-config"
    config.write_text(config.read_text().replace("echo", "echo edited"))
    (prefix / "bin" / "footool").unlink()
    res = run_cli("verify", "--deep", "--python", python, "env.lock", cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "conda:libfoo: modified: bin/foo-config" in res.stdout
    assert "conda:footool: missing: bin/footool" in res.stdout


@pytest.fixture(scope="module")
def conda_lock_file(conda_channel: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lock of the session's conda prefix, captured once for the export tests."""
    out = tmp_path_factory.mktemp("conda-lock") / "env.lock"
    _capture(conda_channel.prefix, out)
    return out


def _install(records: list[Any], prefix: Path, cache: Path) -> None:
    import asyncio

    from rattler import install

    asyncio.run(install(records, target_prefix=str(prefix.resolve()), cache_dir=cache, show_progress=False))


def _export(lock: Path, fmt: str, *extra: str) -> str:
    res = run_cli("export", str(lock), "--to", fmt, *extra, cwd=lock.parent)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.slow
def test_export_conda_explicit_installs_the_same_archives(conda_channel: Any, conda_lock_file: Path,
                                                          tmp_path: Path) -> None:
    """``@EXPLICIT`` lines name each archive with its sha256 (``--md5``: its md5); installed
    from them by py-rattler (the archive fetched from the line's url and checked against the
    line's hash), the prefix verifies against the lock."""
    import asyncio
    import hashlib
    from urllib.parse import urlsplit

    from rattler import RepoDataRecord

    text = _export(conda_lock_file, "conda-explicit")
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert lines[0] == "@EXPLICIT" and len(lines) == 1 + len(conda_channel.packages)
    records = []
    for line in lines[1:]:
        url, _, digest = line.partition("#sha256:")
        archive = Path(urlsplit(url).path)
        assert hashlib.sha256(archive.read_bytes()).hexdigest() == digest
        records.append(asyncio.run(RepoDataRecord.from_package_archive(archive)))
    _install(records, tmp_path / "env", tmp_path / "pkgs")
    assert sorted(r.name.normalized for r in records) == sorted(b.name for b in conda_channel.packages)
    md5_lines = [ln for ln in _export(conda_lock_file, "conda-explicit", "--md5").splitlines()
                 if "#" in ln and not ln.startswith("#")]
    for ln in md5_lines:
        url, _, digest = ln.partition("#")
        assert hashlib.md5(Path(urlsplit(url).path).read_bytes()).hexdigest() == digest
    python = tmp_path / "env" / "bin" / "python"
    res = run_cli("verify", "--python", str(python), str(conda_lock_file), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.slow
def test_export_conda_lock_reads_back_with_conda_lock(conda_channel: Any, conda_lock_file: Path,
                                                      tmp_path: Path) -> None:
    """conda-lock's own parser reads the file (version 1) and ``conda-lock render``'s function
    renders it as an explicit file with every archive."""
    import warnings

    with warnings.catch_warnings():  # conda-lock's vendored conda warns of its own deprecations
        warnings.simplefilter("ignore")
        from conda_lock.conda_lock import render_lockfile_for_platform
        from conda_lock.lockfile import parse_conda_lock_file

    path = tmp_path / "conda-lock.yml"
    path.write_text(_export(conda_lock_file, "conda-lock"))
    parsed = parse_conda_lock_file(path)
    by_name = {p.name: p for p in parsed.package}
    assert sorted(by_name) == sorted(b.name for b in conda_channel.packages)
    for built in conda_channel.packages:
        pkg = by_name[built.name]
        assert pkg.url == built.path.as_uri() and pkg.version == built.version
        assert pkg.hash.sha256 == packages_sha256(built.path) and pkg.manager == "conda"
    assert by_name["footool"].dependencies == {"libfoo": "1.0.*"}
    assert parsed.metadata.platforms == ["linux-64"]
    explicit = render_lockfile_for_platform(lockfile=parsed, include_dev_dependencies=False, extras=None,
                                            kind="explicit", platform="linux-64")
    assert "@EXPLICIT" in explicit
    assert sorted(ln.partition("#")[0] for ln in explicit if ln.startswith("file:")) == sorted(
        b.path.as_uri() for b in conda_channel.packages)


@pytest.mark.slow
def test_export_pixi_reads_back_with_rattler(conda_channel: Any, conda_lock_file: Path, tmp_path: Path) -> None:
    """py-rattler's LockFile reads pixi.lock back; its records install a prefix that verifies."""
    from rattler import LockFile

    path = tmp_path / "pixi.lock"
    path.write_text(_export(conda_lock_file, "pixi"))
    env = LockFile.from_path(path).default_environment()
    assert env is not None
    [platform] = env.platforms()
    records = env.conda_repodata_records_for_platform(platform)
    assert records is not None
    assert sorted(r.name.normalized for r in records) == sorted(b.name for b in conda_channel.packages)
    assert {r.file_name: (r.sha256 or b"").hex() for r in records} == {
        b.path.name: packages_sha256(b.path) for b in conda_channel.packages}
    _install(records, tmp_path / "env", tmp_path / "pkgs")
    res = run_cli("verify", "--python", str(tmp_path / "env" / "bin" / "python"), str(conda_lock_file),
                  cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


def test_conda_exports_refuse_a_lock_without_archives(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A lock captured before envlock recorded archives is refused by name, not written with
    holes; a lock with no conda packages says so."""
    from envlock.commands import main

    old = tmp_path / "old.lock"
    _conda_lock().save(old)
    assert main(["export", str(old), "--to", "conda-explicit"]) == 2
    assert "libfoo has no url or sha256 in the lock" in capsys.readouterr().err
    plain = tmp_path / "plain.lock"
    make_lock().save(plain)
    assert main(["export", str(plain), "--to", "conda-lock"]) == 2
    assert "no conda packages" in capsys.readouterr().err


def _offline(argv: list[str]) -> list[str]:
    """``argv`` in a network namespace of its own (no network at all), as root with util-linux's
    unshare; scripts/test.sh runs as root, and a machine without it fails the test."""
    unshare = shutil.which("unshare")
    assert unshare is not None, "unshare (util-linux) is needed to restore with the network off"
    return [unshare, "-n", *argv]


@pytest.mark.slow
def test_pack_and_restore_a_conda_prefix_offline(conda_channel: Any, conda_lock_file: Path,
                                                 tmp_path: Path) -> None:
    """pack lays the archives out as an indexed channel (each proven by its sha256, all in
    SHA256SUMS) with py-rattler's wheel; restore --target prefix installs the locked records
    with the network off and no solving, verifies the prefix (exit 0), and its python and
    binaries run from where they were installed."""
    import subprocess
    import sys

    from envlock.restore.packdir import check_sums

    pack = tmp_path / "pack"
    res = run_cli("pack", str(conda_lock_file), "-o", str(pack), "--no-image", "--no-download", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "5 conda archives" in res.stdout and "--target prefix DIR" in res.stdout
    sums = check_sums(pack)
    for built in conda_channel.packages:
        rel = f"conda/{built.path.parent.name}/{built.path.name}"
        assert sums[rel] == packages_sha256(built.path)
    assert any(rel.startswith("wheels/py_rattler-0.28.0-") for rel in sums)
    assert "conda/noarch/repodata.json" in sums and "conda/linux-64/repodata.json" in sums
    dest = tmp_path / "restored"
    proc = subprocess.run(_offline([sys.executable, "-m", "envlock", "restore", "pack", "--target",
                                    "prefix", "restored"]),
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: the environment matches the lock" in proc.stdout, proc.stdout
    out = subprocess.run([str(dest / "bin" / "python"), "-c", "import sys, foopy; print(sys.prefix)"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == str(dest)
    tool = subprocess.run([str(dest / "bin" / "footool")], capture_output=True, text=True, timeout=60,
                          check=True).stdout
    assert tool.strip() == f"footool {dest}/share/foo"
    res = run_cli("verify", "--python", str(dest / "bin" / "python"), str(conda_lock_file), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.slow
def test_restore_refuses_a_tampered_missing_or_extra_archive(conda_channel: Any, conda_lock_file: Path,
                                                             tmp_path: Path) -> None:
    """envlock checks every archive against the lock (py-rattler does not check file: ones):
    a changed, missing or extra archive is refused by name and no prefix is left behind."""
    from envlock.lock import load
    from envlock.restore.condatarget import restore_prefix

    lock = load(conda_lock_file)
    channel = tmp_path / "channel"
    shutil.copytree(conda_channel.dir, channel)
    libfoo = channel / "linux-64" / "libfoo-1.0-h0_0.tar.bz2"
    libfoo.write_bytes(libfoo.read_bytes() + b"\0")
    (channel / "noarch" / "foopy-0.1-pyh0_0.tar.bz2").unlink()
    (channel / "noarch" / "extra-1.0-0.tar.bz2").write_bytes(b"x")
    dest = tmp_path / "prefix"
    with pytest.raises(Exception) as refused:
        restore_prefix(lock, channel, dest, verify=False)
    message = str(refused.value)
    assert "missing: noarch/foopy-0.1-pyh0_0.tar.bz2" in message
    assert "sha256 differs): linux-64/libfoo-1.0-h0_0.tar.bz2" in message
    assert "not in the lock: noarch/extra-1.0-0.tar.bz2" in message
    assert not dest.exists()


@pytest.mark.slow
def test_restore_prefix_from_a_channel_directory(conda_channel: Any, conda_lock_file: Path, tmp_path: Path) -> None:
    """``--conda-channel DIR`` (a local mirror, or a pack's conda/) instead of a pack: the same
    checks and install, with the lock itself."""
    res = run_cli("restore", str(conda_lock_file), "--target", "prefix", "env", "--conda-channel",
                  str(conda_channel.dir), "--no-verify", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "env" / "conda-meta" / "libfoo-1.0-h0_0.json").is_file()
    res = run_cli("restore", str(conda_lock_file), "--target", "prefix", "env2", cwd=tmp_path)
    assert res.returncode == 2 and "--conda-channel DIR" in res.stderr


def _wheel(directory: Path, name: str, version: str) -> Path:
    """A pure-Python wheel of one module, written by hand (RECORD with its hashes)."""
    import base64
    import hashlib
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n".encode(),
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for path, data in files.items()) + f"{info}/RECORD,,\n"
    out = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
        zf.writestr(f"{info}/RECORD", record)
    return out


@pytest.mark.slow
def test_pip_packages_on_top_of_conda_are_packed_and_restored(conda_channel: Any, tmp_path: Path) -> None:
    """A package pip installed into the conda prefix stays a [[packages]] row of its own; the
    pack holds its wheel beside the conda archives, and the restore installs it (hash required)
    into the prefix after py-rattler's records, offline; verify passes and it imports."""
    import subprocess
    import sys

    prefix = _copy_prefix(conda_channel, tmp_path)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "demo_pip", "1.0")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(prefix / "bin" / "python"), "install", "-q",
                    "--no-index", "--no-deps", "--disable-pip-version-check", "--find-links", str(wheels),
                    "demo_pip==1.0"], check=True, capture_output=True, timeout=300)
    lock = _capture(prefix, tmp_path / "env.lock")
    demo = next(p for p in lock["packages"] if p["name"] == "demo-pip")
    assert demo["installer"] == "pip" and demo["source"] == "index"
    res = run_cli("pack", "env.lock", "-o", "pack", "--no-image", "--no-download", "--wheelhouse", str(wheels),
                  cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "1 wheel" in res.stdout and "5 conda archives" in res.stdout
    proc = subprocess.run(_offline([sys.executable, "-m", "envlock", "restore", "pack", "--target", "prefix",
                                    "restored"]),
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK: the environment matches the lock" in proc.stdout
    out = subprocess.run([str(tmp_path / "restored" / "bin" / "python"), "-c",
                          "import demo_pip, foopy; print(demo_pip.VERSION)"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "1.0"


class _FailingEngine:
    """A builder whose build writes its log and fails, as a crashed build step does."""

    def build(self, context: Path, *, tag: str, labels: dict[str, str], log_path: Path, progress: Any,
              network: bool) -> str:
        from envlock.errors import BuildFailed

        assert (context / "Dockerfile").is_file() and not network
        Path(log_path).write_text("Fatal Python error: Segmentation fault\n", encoding="utf-8")
        raise BuildFailed("image build failed at step 5/5", step="5/5", log_tail=[], log_path=str(log_path),
                          hint=f"full build log: {log_path}")


@pytest.mark.slow
def test_a_failed_conda_image_build_names_a_log_that_is_still_there(conda_lock_file: Path, tmp_path: Path) -> None:
    """The build context is a temporary directory, gone when the restore ends; the log its
    failure names is kept beside it, so the hint points at a file a user can open."""
    from envlock.errors import BuildFailed
    from envlock.restore.cachedir import entries
    from envlock.restore.condatarget import restore_conda_image
    from envlock.restore.packdir import open_pack

    pack_dir = tmp_path / "pack"
    res = run_cli("pack", str(conda_lock_file), "-o", str(pack_dir), "--no-image", "--no-download", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    pack = open_pack(pack_dir, tmp_path)
    assert pack.conda_channel is not None
    lock = load(conda_lock_file)
    cache = tmp_path / "cache"
    workdir = cache / f"t-{lock.short_id}"  # as `envlock restore` names a lock's directory
    with pytest.raises(BuildFailed) as exc:
        restore_conda_image(_FailingEngine(), lock, pack.conda_channel, pack.wheels,
                            base="envlock-test/base:1", tag=f"envlock/t:{lock.short_id}", workdir=workdir,
                            quiet=True)
    named = Path((exc.value.hint or "").removeprefix("full build log: "))
    assert named.read_text() == "Fatal Python error: Segmentation fault\n"
    assert [p.name for p in workdir.iterdir()] == [named.name]  # the context itself is gone
    # Kept where `envlock cache` sees it, so a prune removes it with restore's other contexts.
    assert [(e.kind, e.path) for e in entries(cache)] == [("context", workdir)]
