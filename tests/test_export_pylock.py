"""``envlock export --to pylock|requirements``, checked by the real installers (uv, pip).

A venv is filled by uv from a local index (the test wheelhouse served over HTTP on 127.0.0.1),
captured, exported, and the export installed into an empty venv by uv and pip; ``envlock
verify`` of that venv must then report no package drift.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib
from export_index import layout, serve
from helpers import LockFactory, run_cli, unavailable
from packaging.pylock import Pylock

SMALL = ("six==1.17.0", "idna==3.10", "attrs==24.2.0", "tomli==2.0.1")


def uv() -> str:
    from uv import find_uv_bin

    return find_uv_bin()


@pytest.fixture(scope="module")
def index(wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a server with /simple (everything) and /whl/cpu (torch only, like PyTorch's)."""
    root = layout(wheelhouse, tmp_path_factory.mktemp("index"))
    layout(wheelhouse, root, simple="whl/cpu", only=("torch",))
    with serve(root) as url:
        yield url


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, installer_clean: Path) -> Path:
    """Private caches for envlock and uv: nothing read from or left in the user's, and none of
    this machine's pip or uv configuration (its extra indexes and find-links) takes part."""
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "envlock-cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("UV_NO_CONFIG", "1")
    for var in ("UV_INDEX_URL", "UV_DEFAULT_INDEX", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def empty_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def captured(tmp: Path, index: str, specs: tuple[str, ...], name: str = "env.lock") -> Path:
    """A lock of a venv that uv filled from the local index (no pip inside, like `uv venv`)."""
    py = empty_venv(tmp / "src")
    subprocess.run([uv(), "pip", "install", "-q", "--python", str(py), "--index-url",
                    f"{index}/simple", *specs], check=True)
    lock = tmp / name
    r = run_cli("capture", "--python", str(py), "--no-torch", "-o", str(lock))
    assert r.returncode == 0, r.stderr
    return lock


def package_drift(lock: Path, py: Path) -> list[dict[str, object]]:
    r = run_cli("verify", str(lock), "--python", str(py), "--no-torch", "--json")
    report = json.loads(r.stdout)
    drift = [d for d in report["differences"] if str(d["path"]).startswith("packages")
             and d["severity"] != "info"]
    assert r.returncode == 0 or drift, r.stdout
    return drift


def test_pylock_installs_the_lock_with_uv(isolated: Path, index: str) -> None:
    lock = captured(isolated, index, SMALL)
    out = isolated / "pylock.toml"
    r = run_cli("export", str(lock), "--to", "pylock", "-o", str(out), "--index-url", f"{index}/simple")
    assert r.returncode == 0, r.stderr
    doc = tomllib.loads(out.read_text())
    Pylock.from_dict(doc).validate()  # the consumer's own structural check
    assert [p["name"] for p in doc["packages"]] == ["attrs", "idna", "six", "tomli"]
    six = next(p for p in doc["packages"] if p["name"] == "six")
    assert six["version"] == "1.17.0" and six["index"] == f"{index}/simple"
    assert len(six["wheels"][0]["hashes"]["sha256"]) == 64
    assert doc["tool"]["envlock"]["id"] in r.stderr or doc["tool"]["envlock"]["fingerprint"].startswith("sha256:")

    target = empty_venv(isolated / "target")
    proc = subprocess.run([uv(), "pip", "install", "--python", str(target), "-r", str(out)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert package_drift(lock, target) == []


def test_pylock_installs_with_pip(isolated: Path, index: str) -> None:
    wheel = os.environ.get("ENVLOCK_TEST_PIP_WHEEL")
    if not wheel or not Path(wheel).is_file():
        unavailable("ENVLOCK_TEST_PIP_WHEEL (pip >= 26.1, set by scripts/test.sh) is not available")
    lock = captured(isolated, index, SMALL)
    out = isolated / "pylock.toml"
    assert run_cli("export", str(lock), "--to", "pylock", "-o", str(out),
                   "--index-url", f"{index}/simple").returncode == 0
    target = empty_venv(isolated / "target")
    # pip runs from its wheel and installs into the target, which stays free of pip itself.
    proc = subprocess.run([sys.executable, f"{wheel}/pip", "--python", str(target), "install",
                           "--no-input", "--disable-pip-version-check", "-r", str(out)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert package_drift(lock, target) == []


def test_requirements_install_with_require_hashes(isolated: Path, index: str) -> None:
    lock = captured(isolated, index, SMALL)
    out = isolated / "requirements.txt"
    r = run_cli("export", str(lock), "--to", "requirements", "-o", str(out),
                "--index-url", f"{index}/simple")
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert f"--index-url {index}/simple\n" in text
    assert "six==1.17.0 \\\n    --hash=sha256:" in text
    target = empty_venv(isolated / "target")
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(target), "install",
                           "--no-input", "--disable-pip-version-check", "--require-hashes",
                           "-r", str(out)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert package_drift(lock, target) == []


def test_missing_files_are_named_and_exit_3(isolated: Path, index: str, restore_lock: LockFactory) -> None:
    from envlock.lock import save

    lock = restore_lock(packages=[("six", "1.17.0"), ("no-such-dist", "1.0"), ("idna", "9.9")])
    path = save(lock, isolated / "env.lock")
    r = run_cli("export", str(path), "--to", "pylock", "--index-url", f"{index}/simple")
    assert r.returncode == 3
    assert "no-such-dist==1.0 (not on" in r.stderr and "idna==9.9" in r.stderr
    assert "six" not in r.stderr.split("error:")[1].split("hint:")[0]
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_unreachable_index_exit_3_and_bad_url_exit_2(isolated: Path, restore_lock: LockFactory) -> None:
    from envlock.lock import save

    path = save(restore_lock(), isolated / "env.lock")
    r = run_cli("export", str(path), "--to", "pylock", "--no-cache",
                "--index-url", "http://user:s3cret@127.0.0.1:9/simple")
    assert r.returncode == 3 and "cannot reach http://127.0.0.1:9/simple" in r.stderr
    assert "s3cret" not in r.stderr
    r = run_cli("export", str(path), "--to", "pylock", "--index-url", "ftp://example/simple")
    assert r.returncode == 2 and "--index-url" not in r.stdout


def test_cache_answers_when_the_index_is_gone(isolated: Path, wheelhouse: Path) -> None:
    root = layout(wheelhouse, isolated / "idx")
    with serve(root) as url:
        lock = captured(isolated, url, ("six==1.17.0",))
        first = run_cli("export", str(lock), "--to", "requirements", "--index-url", f"{url}/simple")
    assert first.returncode == 0, first.stderr
    again = run_cli("export", str(lock), "--to", "requirements", "--index-url", f"{url}/simple")
    assert again.returncode == 0 and again.stdout == first.stdout
    cached = list((isolated / "envlock-cache" / "simple").rglob("*.json"))
    assert [p.name for p in cached] == ["six.json"]
    assert not list((isolated / "envlock-cache").rglob(".six.json*"))  # no temp file left
    gone = run_cli("export", str(lock), "--to", "requirements", "--index-url", f"{url}/simple",
                   "--refresh")
    assert gone.returncode == 3 and "cannot reach" in gone.stderr


def test_offline_from_a_bundle(isolated: Path, index: str) -> None:
    lock = captured(isolated, index, SMALL)
    bundle = isolated / "bundle"
    b = run_cli("bundle", str(lock), "-o", str(bundle), "--wheelhouse",
                os.environ["ENVLOCK_TEST_WHEELHOUSE"])
    assert b.returncode == 0, b.stderr
    out = isolated / "pylock.toml"
    r = run_cli("export", str(lock), "--to", "pylock", "-o", str(out), "--wheelhouse", str(bundle))
    assert r.returncode == 0, r.stderr
    doc = tomllib.loads(out.read_text())
    assert all(w["path"].startswith("bundle/") for p in doc["packages"] for w in p["wheels"])
    assert all("index" not in p for p in doc["packages"])
    target = empty_venv(isolated / "target")
    env = {**os.environ, "UV_OFFLINE": "1"}
    proc = subprocess.run([uv(), "pip", "install", "--python", str(target), "-r", str(out)],
                          capture_output=True, text=True, check=False, env=env, cwd=isolated)
    assert proc.returncode == 0, proc.stderr
    assert package_drift(lock, target) == []
    req = run_cli("export", str(lock), "--to", "requirements", "--wheelhouse", str(bundle))
    assert f"--no-index\n--find-links {bundle.resolve()}\n" in req.stdout


def test_torch_build_points_at_its_own_index(isolated: Path, index: str, restore_lock: LockFactory) -> None:
    from envlock.lock import save

    lock = restore_lock(packages=[("torch", "2.13.0+cpu"), ("six", "1.17.0")])
    path = save(lock, isolated / "env.lock")
    args = ["export", str(path), "--index-url", f"{index}/simple",
            "--torch-index-url", f"{index}/whl/{{label}}"]
    req = run_cli(*args, "--to", "requirements")
    assert req.returncode == 0, req.stderr
    assert f"--extra-index-url {index}/whl/cpu\n" in req.stdout
    assert "torch==2.13.0+cpu \\\n    --hash=sha256:" in req.stdout
    py = run_cli(*args, "--to", "pylock")
    doc = tomllib.loads(py.stdout.split("\n", 2)[2])
    torch = next(p for p in doc["packages"] if p["name"] == "torch")
    assert torch["index"] == f"{index}/whl/cpu"
    assert torch["wheels"][0]["url"].endswith("torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl")


@pytest.mark.slow
def test_torch_lock_installs_with_uv(isolated: Path, index: str) -> None:
    """The paper case: a torch lock replayed by a reader who has uv and no envlock."""
    lock = captured(isolated, index, ("torch==2.13.0+cpu",))
    out = isolated / "pylock.toml"
    r = run_cli("export", str(lock), "--to", "pylock", "-o", str(out), "--index-url", f"{index}/simple",
                "--torch-index-url", f"{index}/whl/{{label}}")
    assert r.returncode == 0, r.stderr
    shutil.rmtree(isolated / "uv-cache")  # a reader's cold cache
    target = empty_venv(isolated / "target")
    proc = subprocess.run([uv(), "pip", "install", "--python", str(target), "-r", str(out)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert package_drift(lock, target) == []


def test_cyclonedx_hashes_come_from_the_index(isolated: Path, index: str, restore_lock: LockFactory) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    from envlock.lock import save

    path = save(restore_lock(packages=[("six", "1.17.0")]), isolated / "env.lock")
    r = run_cli("export", str(path), "--to", "cyclonedx", "--hashes", "--index-url", f"{index}/simple")
    assert r.returncode == 0, r.stderr
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(r.stdout) is None
    six = next(c for c in json.loads(r.stdout)["components"] if c["name"] == "six")
    assert six["hashes"][0]["alg"] == "SHA-256" and len(six["hashes"][0]["content"]) == 64
    assert six["purl"] == f"pkg:pypi/six@1.17.0?repository_url={index}/simple"


def test_index_credentials_never_reach_the_export(isolated: Path, index: str, restore_lock: LockFactory) -> None:
    """Leak test: a token in --index-url is used to read the index, never written out."""
    from envlock.lock import save

    path = save(restore_lock(packages=[("six", "1.17.0"), ("idna", "3.10")]), isolated / "env.lock")
    with_token = index.replace("http://", "http://alice:s3cret-token@")
    for fmt in ("pylock", "requirements", "cyclonedx"):
        r = run_cli("export", str(path), "--to", fmt, "--hashes" if fmt == "cyclonedx" else "--refresh",
                    "--index-url", f"{with_token}/simple", "--skip", "IDNA")
        assert r.returncode == 0, r.stderr
        assert "s3cret" not in r.stdout and "alice" not in r.stdout and "s3cret" not in r.stderr
        # over-redaction twin: the index itself is still named, host and port intact
        assert f"{index}/simple" in r.stdout
        if fmt != "cyclonedx":  # an SBOM lists every package; --skip only spares the lookup
            assert "idna" not in r.stdout.lower()  # --skip, in any spelling
