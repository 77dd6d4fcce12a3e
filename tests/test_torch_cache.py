"""The torch facts cache: a verify that imports nothing when nothing torch depends on moved.

Real torch throughout: the CLI runs the probe in a fresh interpreter, which either imports
torch ("live") or reuses the facts of an earlier run ("cached").
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: F401 - a pinned dev dependency: without it these tests would check nothing
from helpers import REPO, run_cli

from envlock.probe import source
from envlock.probe.cache import cache_read, cache_write, torch_cache_key
from envlock.probe.collect import collect
from envlock.probe.packages import collect_packages
from envlock.probe.statcache import cache_dir
from envlock.probing.process import parse_document

pytestmark = pytest.mark.slow  # each live run imports torch in a fresh interpreter
PROBE = str(REPO / "envlock" / "probe")


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("ENVLOCK_SEED", "ENVLOCK_NO_CACHE", "LD_LIBRARY_PATH")}
    env.update({"ENVLOCK_CACHE_DIR": str(cache), **extra})
    return env


def _probe(cache: Path, *args: str, python: str = sys.executable, **extra: str) -> dict[str, Any]:
    out = subprocess.run([python, PROBE, *args], env=_env(cache, **extra),
                         capture_output=True, check=True, timeout=600).stdout
    doc: dict[str, Any] = parse_document(out, "")
    return doc


def _facts(cache: Path, *args: str, python: str = sys.executable, **extra: str) -> str:
    return str(_probe(cache, *args, python=python, **extra)["probe"]["torch_facts"])


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("torch-facts-*.json"))


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding the facts of this interpreter, as the first capture leaves it."""
    cache = tmp_path_factory.mktemp("cache")
    assert _facts(cache) == "live"
    assert len(_entries(cache)) == 1
    return cache


def test_second_run_is_cached_and_says_so(tmp_path: Path, warm: Path) -> None:
    live = _probe(tmp_path / "fresh", "--no-cache")
    cached = _probe(warm)
    assert cached["probe"]["torch_facts"] == "cached" and live["probe"]["torch_facts"] == "live"
    assert cached["torch"] == live["torch"]
    assert cached["determinism"] == live["determinism"]
    # What `import torch` mapped, and the runtimes among it, come from the cache too.
    assert cached["native"] == live["native"] and any(
        lib["name"].startswith("libtorch_cpu") for lib in cached["native"]["libraries"])
    # --no-cache read nothing, and wrote what it imported (see the refresh test below).
    assert [json.loads(p.read_text())["facts"]["torch"] for p in _entries(tmp_path / "fresh")] == [
        live["torch"]]
    res = run_cli("capture", "-o", str(tmp_path / "env.lock"), cwd=tmp_path,
                  env={"ENVLOCK_CACHE_DIR": str(warm)})
    assert res.returncode == 0, res.stderr
    res = run_cli("verify", str(tmp_path / "env.lock"), "--json", cwd=tmp_path,
                  env={"ENVLOCK_CACHE_DIR": str(warm)})
    assert res.returncode == 0, res.stdout
    assert json.loads(res.stdout)["torch_facts"] == "cached"
    res = run_cli("verify", str(tmp_path / "env.lock"), "--no-cache", cwd=tmp_path,
                  env={"ENVLOCK_CACHE_DIR": str(warm)})
    assert res.returncode == 0 and "torch facts: live" in res.stdout


@pytest.mark.parametrize("var", ["TORCH_SHOW_CPP_STACKTRACES", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
                                 "ATEN_CPU_CAPABILITY", "MKL_NUM_THREADS"])
def test_a_relevant_variable_makes_the_next_run_live(warm: Path, var: str) -> None:
    value = "1" if var != "ATEN_CPU_CAPABILITY" else "default"
    key_before = _key()
    os.environ[var] = value
    try:
        assert _key() != key_before
    finally:
        del os.environ[var]
    assert _key() == key_before


def test_unrelated_variable_keeps_the_cache(warm: Path) -> None:
    assert _facts(warm, SOME_UNRELATED_SETTING="x") == "cached"


def test_variable_end_to_end_live_then_cached(tmp_path: Path, warm: Path) -> None:
    assert _facts(warm, TORCH_SHOW_CPP_STACKTRACES="1") == "live"
    assert _facts(warm, TORCH_SHOW_CPP_STACKTRACES="1") == "cached"


def test_ld_library_path_cuda_library_added_or_touched(tmp_path: Path, warm: Path) -> None:
    libs = tmp_path / "libs"
    libs.mkdir()
    assert _facts(warm, LD_LIBRARY_PATH=str(libs)) == "live"  # the variable itself
    assert _facts(warm, LD_LIBRARY_PATH=str(libs)) == "cached"
    cudnn = libs / "libcudnn.so.9"
    cudnn.write_bytes(b"\0" * 64)  # not a real library: the loader is never asked to open it
    assert _facts(warm, LD_LIBRARY_PATH=str(libs)) == "live"
    assert _facts(warm, LD_LIBRARY_PATH=str(libs)) == "cached"
    st = cudnn.stat()
    os.utime(cudnn, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert _facts(warm, LD_LIBRARY_PATH=str(libs)) == "live"
    (libs / "README").write_text("not a library")
    assert _facts(warm, LD_LIBRARY_PATH=str(libs)) == "cached"


def test_another_interpreter_is_live(tmp_path: Path, warm: Path) -> None:
    """A second venv that sees the very same torch (through a .pth) is still another key."""
    import sysconfig

    venv = tmp_path / "other"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = Path(sysconfig.get_paths()["purelib"])
    other_site = next((venv / "lib").glob("python3*/site-packages"))
    (other_site / "torch-site.pth").write_text(str(purelib) + "\n")
    python = str(venv / "bin" / "python")
    assert _facts(warm, python=python) == "live"
    assert _facts(warm, python=python) == "cached"
    assert _facts(warm) == "cached"  # this interpreter's entry is still there


def test_torch_library_file_touched_changes_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's and nvidia-*'s shared libraries (from their RECORD) are keyed by stat.

    A distribution placed first on sys.path stands in for them, so that the test never
    touches the installed torch.
    """
    site_dir = tmp_path / "site"
    for dist, lib in (("torch-9.9.9", "torch/lib/libtorch_cpu.so"),
                      ("nvidia_cudnn_cu12-9.1.0", "nvidia/cudnn/lib/libcudnn.so.9")):
        (site_dir / lib).parent.mkdir(parents=True, exist_ok=True)
        (site_dir / lib).write_bytes(b"\0" * 32)
        info = site_dir / f"{dist}.dist-info"
        info.mkdir()
        (info / "RECORD").write_text(f"{lib},sha256=x,32\n{info.name}/RECORD,,\n")
    monkeypatch.syspath_prepend(str(site_dir))
    before = torch_cache_key()
    assert before is not None
    for lib in ("torch/lib/libtorch_cpu.so", "nvidia/cudnn/lib/libcudnn.so.9"):
        path = site_dir / lib
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        after = torch_cache_key()
        assert after != before
        before = after
    (site_dir / "torch-9.9.9.dist-info" / "RECORD").write_text("other,sha256=y,1\n")
    assert torch_cache_key() != before


def test_a_numerics_library_on_ld_library_path_changes_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library `import torch` may load from LD_LIBRARY_PATH in place of its own is keyed by
    stat when it is one that decides numbers (``rules.numerics_library``, the comparator's rule):
    ROCm's hipBLASLt and rocFFT, an older scipy's OpenBLAS; another library is not."""
    site_dir = tmp_path / "site"
    (site_dir / "torch").mkdir(parents=True)
    (site_dir / "torch" / "__init__.py").write_text("")
    info = site_dir / "torch-9.9.9.dist-info"
    info.mkdir()
    (info / "RECORD").write_text(f"torch/__init__.py,sha256=x,0\n{info.name}/RECORD,,\n")
    monkeypatch.syspath_prepend(str(site_dir))
    libs = tmp_path / "cluster-libs"
    libs.mkdir()
    monkeypatch.setenv("LD_LIBRARY_PATH", str(libs))
    before = torch_cache_key()
    assert before is not None
    (libs / "librocksdb.so.8").write_bytes(b"\0" * 8)
    assert torch_cache_key() == before
    for name in ("libhipblaslt.so.0", "librocfft.so.0", "libopenblasp-r0-085ca80a.3.9.so"):
        (libs / name).write_bytes(b"\0" * 8)
        after = torch_cache_key()
        assert after != before, name
        before = after


def _key() -> str:
    key = torch_cache_key()
    assert key is not None
    return key


def test_corrupt_and_foreign_entries_are_ignored_and_rewritten(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert _facts(cache) == "live"
    (entry,) = _entries(cache)
    good = json.loads(entry.read_text())
    entry.write_bytes(b"{not json")
    assert _facts(cache) == "live"
    assert json.loads(entry.read_text()) == good
    # An entry from another key (copied from another machine, or a hash prefix collision).
    foreign = dict(good, key="0" * 64)
    entry.write_text(json.dumps(foreign))
    assert _facts(cache) == "live"
    assert json.loads(entry.read_text()) == good
    entry.write_text(json.dumps(dict(good, facts={"torch": "not a table"})))
    assert _facts(cache) == "live"
    assert _facts(cache) == "cached"


def test_seed_and_canary_are_always_live(warm: Path) -> None:
    assert _facts(warm, ENVLOCK_SEED="7") == "live"
    assert _probe(warm, "--canary")["probe"]["torch_facts"] == "live"
    assert _facts(warm, ENVLOCK_NO_CACHE="1") == "live"


def test_in_process_capture_never_uses_the_cache(warm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(warm))
    doc = collect(torch="auto", cwd=str(warm))
    assert doc["probe"]["torch_facts"] == "live"


def test_concurrent_verifies_share_one_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    lock = tmp_path / "env.lock"
    res = run_cli("capture", "--no-cache", "-o", str(lock), cwd=tmp_path)
    assert res.returncode == 0, res.stderr

    def verify(_: int) -> subprocess.CompletedProcess[str]:
        return run_cli("verify", str(lock), "--json", cwd=tmp_path, env={"ENVLOCK_CACHE_DIR": str(cache)})

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(verify, range(4)))
    for res in results:
        assert res.returncode == 0, res.stdout + res.stderr
        assert json.loads(res.stdout)["torch_facts"] in ("live", "cached")
    assert len(_entries(cache)) == 1
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]
    assert json.loads(verify(0).stdout)["torch_facts"] == "cached"


def test_cache_dir_follows_xdg_and_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ENVLOCK_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == str(tmp_path / "xdg" / "envlock")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == str(tmp_path / "home" / ".cache" / "envlock")
    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == str(tmp_path / "mine")


def test_another_probe_version_is_another_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Facts cached by an older probe (which read fewer torch fields) are never served."""
    before = _key()
    edited = tmp_path / "probe"
    shutil.copytree(source.PACKAGE_DIR, edited, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(source, "PACKAGE_DIR", str(edited))
    assert _key() == before  # the same files elsewhere: the same probe
    # Any module of the package counts, not only the entry point.
    torchstack = edited / "torchstack.py"
    torchstack.write_bytes(torchstack.read_bytes() + b"\n# a newer probe\n")
    assert _key() != before


def _dist(site: Path, name: str, version: str, lib: str) -> None:
    """A distribution as pip leaves it: METADATA, RECORD and a bundled shared library."""
    for old in site.glob(f"{name}-*.dist-info"):
        shutil.rmtree(old)
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (site / lib).parent.mkdir(parents=True, exist_ok=True)
    (site / lib).write_bytes(version.encode())
    (info / "RECORD").write_text(f"{lib},sha256={hashlib.sha256(version.encode()).hexdigest()},"
                                 f"{len(version)}\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")


def test_another_version_of_a_distribution_torch_imports_changes_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pip install numpy==...`` kept the key: the next verify served the old numpy's
    OpenBLAS runtime and a library path that no longer existed. A numpy placed first on
    sys.path stands in for the installed one."""
    site = tmp_path / "site"
    _dist(site, "numpy", "2.0.0", "numpy.libs/libscipy_openblas64_-aaaa.so")
    monkeypatch.syspath_prepend(str(site))
    before = _key()
    # The package scan a capture made anyway gives the same key as the key's own scan.
    assert torch_cache_key(packages=collect_packages(errors=[])[0]) == before
    assert _key() == before
    _dist(site, "numpy", "2.0.1", "numpy.libs/libscipy_openblas64_-bbbb.so")
    after = _key()
    assert after != before
    # Twin: a file that is no distribution's metadata changes nothing.
    (site / "notes.txt").write_text("x")
    assert _key() == after


def test_an_entry_whose_mapped_library_changed_or_went_is_not_served(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from envlock.probe.cache import library_stats

    monkeypatch.setenv("ENVLOCK_CACHE_DIR", str(tmp_path / "cache"))
    lib = tmp_path / "numpy.libs" / "libscipy_openblas64_-aaaa.so"
    lib.parent.mkdir()
    lib.write_bytes(b"\0" * 64)
    key = "a" * 64
    facts = {"torch": {"version": "2.13.0"}, "determinism": {}, "libraries": [str(lib)],
             "library_stats": library_stats([str(lib)]), "runtimes": [], "runtimes_source": "maps"}
    cache_write(key, facts)
    assert cache_read(key) == facts
    lib.write_bytes(b"\0" * 65)  # replaced in place
    assert cache_read(key) is None
    lib.unlink()  # removed: the phantom library a new lock recorded
    assert cache_read(key) is None
    # An entry of a probe that stored no stats is no entry either.
    cache_write(key, {k: v for k, v in facts.items() if k != "library_stats"})
    assert cache_read(key) is None


def test_no_cache_rewrites_a_stale_entry(tmp_path: Path) -> None:
    """``verify --no-cache`` after a stale hit imported torch but left the entry as it was, so
    the next verify without the flag served the stale facts again."""
    cache = tmp_path / "cache"
    assert _facts(cache) == "live"
    (entry,) = _entries(cache)
    good = json.loads(entry.read_text())
    stale = json.loads(entry.read_text())
    stale["facts"]["torch"]["version"] = "0.0.1-stale"
    entry.write_text(json.dumps(stale))
    assert _probe(cache)["torch"]["version"] == "0.0.1-stale"  # the stale hit the user saw
    live = _probe(cache, "--no-cache")
    assert live["probe"]["torch_facts"] == "live"
    assert json.loads(entry.read_text()) == good
    again = _probe(cache)
    assert again["probe"]["torch_facts"] == "cached" and again["torch"] == live["torch"]
    # Twin: ENVLOCK_NO_CACHE trusts no cache, and writes none either.
    assert _facts(tmp_path / "off", ENVLOCK_NO_CACHE="1") == "live"
    assert _entries(tmp_path / "off") == []
