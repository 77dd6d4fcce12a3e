"""``verify --deep`` / ``capture --deep``: every installed file against its RECORD.

The venvs here are real: a wheel built on the spot is installed by pip and by uv, which write
RECORD, INSTALLER, direct_url.json and a console script the way they do for any package.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envlock.probe import deep

NAME = "demo_pkg"


def _rec(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(out: Path, version: str = "1.0", modules: int = 14) -> Path:
    files = {f"{NAME}/__init__.py": b"VALUE = 1\n\ndef main():\n    print(VALUE)\n"}
    for i in range(modules):
        files[f"{NAME}/sub/m{i}.py"] = f"X = {i}\n".encode()
    files[f"{NAME}/data.bin"] = bytes(range(256)) * 8192  # 2 MiB: the streamed path
    info = f"{NAME}-{version}.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: demo-pkg\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/entry_points.txt"] = f"[console_scripts]\ndemo-cli = {NAME}:main\n".encode()
    record = "".join(f"{p},{_rec(d)},{len(d)}\n" for p, d in files.items()) + f"{info}/RECORD,,\n"
    path = out / f"{NAME}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, d in files.items():
            zf.writestr(p, d)
        zf.writestr(f"{info}/RECORD", record)
    return path


def _uv() -> str | None:
    here = Path(sys.executable).with_name("uv")
    return str(here) if here.exists() else shutil.which("uv")


def make_venv(root: Path, wheel: Path, installer: str = "pip") -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    py = str(root / "bin" / "python")
    if installer == "pip":
        argv = [sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-index",
                "--disable-pip-version-check", str(wheel)]
    else:
        uv = _uv()
        assert uv is not None, "uv, a dev dependency, is not installed"
        argv = [uv, "pip", "install", "-q", "--offline", "--python", py, str(wheel)]
    subprocess.run(argv, check=True, timeout=300)
    return root


def site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's caches (file hashes, torch facts) in its own directory, not the user's."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(cache))
    return cache


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    return make_venv(tmp_path_factory.mktemp("base") / "venv", wheel)


@pytest.fixture
def venv(tmp_path: Path, base_venv: Path) -> Path:
    """A private copy per test (the tests edit files); the script's shebang still names the
    base venv, which changes none of its bytes."""
    copy = tmp_path / "venv"
    shutil.copytree(base_venv, copy, symlinks=True)
    return copy


def _capture(venv: Path, out: Path, *extra: str) -> dict[str, Any]:
    res = run_cli("capture", "--python", str(venv), "-o", str(out), *extra, cwd=out.parent)
    assert res.returncode == 0, res.stderr
    import tomllib

    return tomllib.loads(out.read_text())


def _verify(venv: Path, lock: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli("verify", str(lock), "--python", str(venv), *extra, cwd=lock.parent)


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_clean_install_is_ok_and_digest_is_installer_independent(
        tmp_path: Path, wheel: Path, installer: str) -> None:
    venv = make_venv(tmp_path / installer, wheel, installer)
    data = _capture(venv, tmp_path / "env.lock", "--deep")
    pkg = next(p for p in data["packages"] if p["name"] == "demo-pkg")
    assert "files_changed" not in pkg
    # The script's shebang, INSTALLER and direct_url.json name the venv and the installer; the
    # digest leaves them out, so pip and uv installs of one wheel agree on it.
    expected = deep.files_digest({
        rel: _rec((site(venv) / rel).read_bytes())
        for rel in [f"{NAME}/__init__.py", f"{NAME}/data.bin", *(f"{NAME}/sub/m{i}.py" for i in range(14)),
                    f"{NAME}-1.0.dist-info/METADATA", f"{NAME}-1.0.dist-info/WHEEL",
                    f"{NAME}-1.0.dist-info/entry_points.txt"]})
    assert pkg["files_sha256"] == expected
    res = _verify(venv, tmp_path / "env.lock", "--deep")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "every file matches RECORD" in res.stdout


def test_edited_missing_added_files_are_each_named(tmp_path: Path, venv: Path) -> None:
    lock = tmp_path / "env.lock"
    _capture(venv, lock)
    pkg = site(venv) / NAME
    with open(pkg / "__init__.py", "a") as fh:
        fh.write("print('debug')\n")
    (pkg / "sub" / "m3.py").unlink()
    (pkg / "sub" / "patch.py").write_text("X = 0\n")
    # Legitimate changes: bytecode the interpreter writes is neither modified nor added.
    (pkg / "sub" / "__pycache__").mkdir(exist_ok=True)
    (pkg / "sub" / "__pycache__" / "m1.cpython-399.pyc").write_bytes(b"\0" * 16)
    script = venv / "bin" / "demo-cli"
    script.write_text(script.read_text() + "# edited\n")

    assert _verify(venv, lock).returncode == 0  # the plain verify cannot see any of it
    res = _verify(venv, lock, "--deep")
    assert res.returncode == 1
    for line in (f"demo-pkg: modified: {NAME}/__init__.py", f"demo-pkg: missing: {NAME}/sub/m3.py",
                 f"demo-pkg: added (not in RECORD): {NAME}/sub/patch.py",
                 "demo-pkg: modified: ../../../bin/demo-cli"):
        assert line in res.stdout, res.stdout
    assert "__pycache__" not in res.stdout
    report = json.loads(_verify(venv, lock, "--deep", "--json").stdout)["deep"]
    assert report["dists"] == {"demo-pkg": {
        "added": [f"{NAME}/sub/patch.py"], "missing": [f"{NAME}/sub/m3.py"],
        "modified": ["../../../bin/demo-cli", f"{NAME}/__init__.py"]}}


# The probe's deep check run in-process in another interpreter, with a clock that reads past
# the racy window of every file written so far (argv: the probe's directory, "cache" or not).
_DEEP_LATER = """
import importlib, importlib.util, json, os, sys, time
here = sys.argv[1]
spec = importlib.util.spec_from_file_location(
    "_envlock_probe", os.path.join(here, "__init__.py"), submodule_search_locations=[here])
package = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = package
spec.loader.exec_module(package)
collect = importlib.import_module("_envlock_probe.collect")
racy = importlib.import_module("_envlock_probe.filehashes").RACY_NS
doc = collect.collect(torch="no", deep=True, cache=sys.argv[2] == "cache", processes=True,
                      skip_dir=here, now_ns=lambda: time.time_ns() + racy + 10**9)
print(json.dumps(doc["deep"]))
"""


def _deep_later(venv: Path, cache: bool = True) -> dict[str, Any]:
    """``verify --deep`` (``--no-cache`` unless ``cache``) as it would run once the files just
    copied are older than the racy window: the probe in-process, its clock passed in."""
    py = venv / "bin" / "python"
    res = subprocess.run([str(py), "-I", "-c", _DEEP_LATER, str(REPO / "envlock" / "probe"),
                          "cache" if cache else "no-cache"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ""}, timeout=300)
    assert res.returncode == 0, res.stderr
    report: dict[str, Any] = json.loads(res.stdout)
    return report


def test_a_second_verify_deep_reads_only_what_changed(tmp_path: Path, venv: Path) -> None:
    """The copy is new, so the cache stores nothing of it until the racy window has passed: the
    runs that fill it pass a clock; the verifies that read it run as users run them."""
    lock = tmp_path / "env.lock"
    _capture(venv, lock, "--deep")
    warm = _deep_later(venv)
    assert warm["stat_cache"] == "used" and warm["hashed_files"] == warm["files"] > 20

    def deep_report(*extra: str) -> dict[str, Any]:
        res = _verify(venv, lock, "--deep", "--json", *extra)
        assert res.returncode == 0, res.stdout + res.stderr
        report: dict[str, Any] = json.loads(res.stdout)["deep"]
        return report

    first = deep_report()
    assert first["stat_cache"] == "used" and first["files"] == warm["files"]
    assert (first["hashed_files"], first["hashed_bytes"]) == (0, 0)
    assert (first["cached_files"], first["cached_bytes"]) == (first["files"], first["bytes"])
    full = _deep_later(venv, cache=False)
    assert full["stat_cache"] == "ignored" and full["cached_files"] == 0
    assert (full["hashed_files"], full["hashed_bytes"]) == (first["files"], first["bytes"])
    second = deep_report()  # --no-cache rewrote the cache: still warm
    assert second == {**first, "seconds": second["seconds"]}
    assert first["dists"] == second["dists"] == full["dists"] == {}
    res = _verify(venv, lock, "--deep")
    assert (f"0 re-hashed, {first['files']} unchanged since the last check by size/mtime/ctime "
            "(--no-cache re-hashes all); every file matches RECORD") in res.stdout
    with open(site(venv) / NAME / "sub" / "m2.py", "a") as fh:
        fh.write("# edited\n")
    res = _verify(venv, lock, "--deep")
    assert res.returncode == 1 and f"demo-pkg: modified: {NAME}/sub/m2.py" in res.stdout
    assert f"1 re-hashed, {first['files'] - 1} unchanged" in res.stdout


def test_first_files_per_dist_then_all(tmp_path: Path, venv: Path) -> None:
    lock = tmp_path / "env.lock"
    _capture(venv, lock)
    for i in range(14):
        with open(site(venv) / NAME / "sub" / f"m{i}.py", "a") as fh:
            fh.write("# edited\n")
    res = _verify(venv, lock, "--deep")
    assert res.returncode == 1
    assert res.stdout.count("demo-pkg: modified:") == 10
    assert "demo-pkg: 4 more files differ from RECORD (--all lists them)" in res.stdout
    res = _verify(venv, lock, "--deep", "--all")
    assert res.stdout.count("demo-pkg: modified:") == 14 and "more file" not in res.stdout


def test_capture_deep_catches_a_file_edited_before_capture(tmp_path: Path, venv: Path) -> None:
    init = site(venv) / NAME / "__init__.py"
    original = init.read_bytes()
    init.write_bytes(original + b"# local patch\n")
    lock = tmp_path / "env.lock"
    res = run_cli("capture", "--python", str(venv), "-o", str(lock), "--deep", cwd=tmp_path)
    assert "files differ from RECORD in 1 distribution (demo-pkg)" in res.stderr
    import tomllib

    data = tomllib.loads(lock.read_text())
    pkg = next(p for p in data["packages"] if p["name"] == "demo-pkg")
    assert pkg["files_changed"] == [f"modified {NAME}/__init__.py"]
    init.write_bytes(original)  # a clean machine: every file matches RECORD again
    res = _verify(venv, lock, "--deep")
    assert res.returncode == 1
    assert "packages.demo-pkg.files_changed" in res.stdout and f"{NAME}/__init__.py" in res.stdout
    assert "packages.demo-pkg.files_sha256" in res.stdout
    # Without --deep there is nothing file-wise to compare: not drift.
    assert _verify(venv, lock).returncode == 0


def test_deep_capture_keeps_the_fingerprint(tmp_path: Path, venv: Path) -> None:
    plain = _capture(venv, tmp_path / "plain.lock")
    deep_lock = _capture(venv, tmp_path / "deep.lock", "--deep")
    assert plain["envlock"]["fingerprint"] == deep_lock["envlock"]["fingerprint"]
    assert plain["envlock"]["integrity"] != deep_lock["envlock"]["integrity"]
    # A plain lock verified with --deep: the files are checked against RECORD only.
    assert _verify(venv, tmp_path / "plain.lock", "--deep").returncode == 0


def test_api_verify_deep(tmp_path: Path, venv: Path) -> None:
    import envlock

    lock = envlock.capture(python=str(venv / "bin" / "python"), torch=False)
    (site(venv) / NAME / "sub" / "m0.py").write_text("X = 'patched'\n")
    assert envlock.verify(lock, python=str(venv / "bin" / "python")).ok
    cmp = envlock.verify(lock, python=str(venv / "bin" / "python"), deep=True)
    assert not cmp.ok
    assert [d.path for d in cmp.by_category("files")] == [f"files.demo-pkg.{NAME}/sub/m0.py"]


# -- deep.check on hand-made site directories -------------------------------------------------


def _install(site_dir: Path, dist: str, files: dict[str, bytes]) -> None:
    info = site_dir / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    lines = []
    for rel, data in files.items():
        (site_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (site_dir / rel).write_bytes(data)
        lines.append(f"{rel},{_rec(data)},{len(data)}")
    lines.append(f"{info.name}/RECORD,,")
    (info / "RECORD").write_text("\n".join(lines) + "\n")


def test_namespace_directory_shared_by_two_distributions(tmp_path: Path) -> None:
    _install(tmp_path, "ns_a", {"nvidia/a/lib.so": b"a" * 10, "nvidia/a/__init__.py": b""})
    _install(tmp_path, "ns_b", {"nvidia/b/lib.so": b"b" * 10})
    (tmp_path / "nvidia" / "b" / "extra.so").write_bytes(b"x")
    (tmp_path / "nvidia" / "stray.txt").write_bytes(b"x")  # nobody's directory: not attributed
    report = deep.check([("ns-a", str(tmp_path), "ns_a-1.0.dist-info"),
                         ("ns-b", str(tmp_path), "ns_b-1.0.dist-info")], workers=2)
    assert report["dists"] == {"ns-b": {"added": ["nvidia/b/extra.so"]}}
    assert report["files"] == 3


def test_record_hash_matches_record_format_small_and_streamed(tmp_path: Path) -> None:
    for size in (0, 100, deep.CHUNK + 12345):
        path = tmp_path / f"f{size}"
        data = os.urandom(size)
        path.write_bytes(data)
        assert deep.record_hash(str(path)) == _rec(data)


def test_forked_shards_agree_with_threads(tmp_path: Path) -> None:
    files = {f"many/m{i:04d}.py": f"x = {i}\n".encode() for i in range(2100)}
    files["many/big.bin"] = os.urandom(deep.CHUNK * 2)
    _install(tmp_path, "many", files)
    (tmp_path / "many" / "m0042.py").write_text("edited\n")
    (tmp_path / "many" / "m1999.py").unlink()
    dists = [("many", str(tmp_path), "many-1.0.dist-info")]
    threads = deep.check(dists, workers=2, processes=False)
    forked = deep.check(dists, workers=2, processes=True)
    assert forked["processes"] and not threads["processes"]
    assert threads["dists"] == forked["dists"] == {
        "many": {"missing": ["many/m1999.py"], "modified": ["many/m0042.py"]}}
    assert threads["digests"] == forked["digests"]
    ticks: list[tuple[int, int, int, int]] = []
    deep.check(dists, workers=2, processes=True, progress=lambda *a: ticks.append(a))
    assert ticks[-1][0] == ticks[-1][1] == 2101


_LINE = st.tuples(
    st.sampled_from(["pkg/a.py", "pkg/sub/b.py", '"pkg/q,uoted.py"', "../../../bin/x", "/abs/p",
                     "pkg/__pycache__/a.cpython-311.pyc", "pkg-1.0.dist-info/RECORD", "pkg/./c.py",
                     "pkg\\win.py", "", "pkg/a.py,extra", "pkg/nul\x00.py"]),
    st.sampled_from(["", "sha256=", "md5=abc", "sha256=AAAA", "sha256=zz,", "x"]),
    st.sampled_from(["", "1", "abc", "-5", "99999999999999999999"]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_LINE, max_size=12), st.binary(max_size=40))
def test_fuzz_record_parsing_never_raises(tmp_path: Path, lines: list[tuple[str, str, str]],
                                          junk: bytes) -> None:
    root = tmp_path / "fuzz"
    shutil.rmtree(root, ignore_errors=True)
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("a\n")
    info = root / "pkg-1.0.dist-info"
    info.mkdir()
    (info / "RECORD").write_bytes("\n".join(",".join(x) for x in lines).encode() + b"\n" + junk)
    report = deep.check([("pkg", str(root), info.name)], workers=2)
    found = report["dists"].get("pkg", {})
    assert set(found) <= {"modified", "missing", "added", "unreadable"}
    assert all(isinstance(x, str) for kind in found.values() for x in kind)
    assert len(report["digests"]["pkg"]) == 64


def test_deep_module_is_stdlib_only_and_py38_syntax() -> None:
    import ast

    source = (REPO / "envlock" / "probe" / "deep.py").read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


def test_progress_lines_are_consumed_and_drawn() -> None:
    from envlock.probing.progress import Progress

    bar = Progress(delay=0.0)
    bar.enabled = True  # as on a terminal
    assert not bar.feed("Traceback (most recent call last):\n")
    assert bar.feed("\x1eenvlock-progress 10 100 1000 100000\n")
    assert bar.bar is not None
    assert bar.feed("\x1eenvlock-progress 100 100 100000 100000\n")
    assert bar.bar.tasks[0].completed == 100000
    bar.close()
    quiet = Progress(delay=0.0)
    quiet.enabled = False  # not a terminal: consumed, never drawn, rich never imported for it
    assert quiet.feed("\x1eenvlock-progress 1 2 3 4\n") and quiet.bar is None
